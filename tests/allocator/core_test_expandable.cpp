// Allocator core unit tests. Expandable segments: growth in place, partial release, OOM.
#include "core_test_common.h"

namespace {

void test_expandable_growth() {
  Env fixed("", true, 1024 * MiB), exp("expandable_segments:True", true, 1024 * MiB);
  // A growing workload (e.g. growing sequence length): long-lived weights, then each step frees the
  // previous activation and allocates a larger one, with small tensors kept alive. Fixed segments
  // cannot reuse the smaller cached segments and keep adding new ones; an expandable segment grows
  // the freed tail in place.
  for (Env* e : {&fixed, &exp}) {
    std::vector<void*> keep;
    for (int w = 0; w < 3; ++w) keep.push_back(e->a->malloc(0, 8 * MiB, 0));
    void* act = nullptr;
    for (int i = 1; i <= 12; ++i) {
      if (act) e->a->free(act);
      act = e->a->malloc(0, i * 11 * MiB, 0);
      std::memset(act, i, 4096);
      keep.push_back(e->a->malloc(0, 4096, 0));
    }
    check_invariants(*e->a);
    e->a->free(act);
    for (void* k : keep) e->a->free(k);
  }
  DeviceStats f = fixed.st(), x = exp.st();
  // Fixed: every step added a segment. Expandable: one large segment, peak = weights + the largest
  // activation rounded to 2 MiB pages (+ the small pool's segment).
  CHECK(f.segment[kLargePool].peak >= 10);
  CHECK_EQ(x.segment[kLargePool].peak, 1);
  CHECK(x.reserved_bytes[kLargePool].peak <= int64_t((24 + 132 + 2) * MiB));
  CHECK(x.reserved_bytes[kAggregate].peak * 3 < f.reserved_bytes[kAggregate].peak);
  exp.a->empty_cache();  // pages are handed back; address space stays reserved
  CHECK_EQ(cur(exp.st().reserved_bytes), 0);
  CHECK_EQ(cur(exp.st().segment), 0);
  // Committing again reuses the same address range, growing contiguously.
  void* a = exp.a->malloc(0, 5 * MiB, 0);
  void* b = exp.a->malloc(0, 5 * MiB, 0);
  CHECK_EQ(U(b), U(a) + 5 * MiB);
  std::memset(a, 1, 5 * MiB);  // committed pages are writable
  std::memset(b, 2, 5 * MiB);
  CHECK_EQ(cur(exp.st().reserved_bytes), int64_t(10 * MiB));
  exp.a->free(a);
  exp.a->free(b);
  check_invariants(*exp.a);
}

void test_expandable_partial_release() {
  Env e("expandable_segments:True");
  void* a = e.a->malloc(0, 8 * MiB, 0);
  void* b = e.a->malloc(0, 8 * MiB, 0);
  void* c = e.a->malloc(0, 8 * MiB, 0);
  e.a->free(b);
  e.a->empty_cache();  // the hole's whole pages go back; a and c stay mapped
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(16 * MiB));
  int mapped_runs = 0;
  for (auto& seg : e.a->snapshot()) mapped_runs += seg.is_expandable ? 1 : 0;
  CHECK_EQ(mapped_runs, 2);
  check_invariants(*e.a);
  void* d = e.a->malloc(0, 8 * MiB, 0);  // the hole is committed again
  CHECK_EQ(U(d), U(b));
  std::memset(d, 3, 8 * MiB);
  e.a->free(a);
  e.a->free(c);
  e.a->free(d);
  check_invariants(*e.a);
}

void test_expandable_oom() {
  Env e("expandable_segments:True", true, 64 * MiB);
  void* a = e.a->malloc(0, 40 * MiB, 0);
  bool oom = false;
  try {
    e.a->malloc(0, 30 * MiB, 0);
  } catch (const OutOfMemoryError&) {
    oom = true;
  }
  CHECK(oom);
  void* b = e.a->malloc(0, 24 * MiB, 0);
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(64 * MiB));
  e.a->free(a);
  e.a->free(b);
}

}  // namespace

static RegisterCoreTests registered{
    {"expandable_growth", test_expandable_growth},
    {"expandable_partial_release", test_expandable_partial_release},
    {"expandable_oom", test_expandable_oom},
};
