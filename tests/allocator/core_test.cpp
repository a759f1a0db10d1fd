// Unit tests of the torch-free caching allocator core (device_core/allocator), with faked device hooks.
// Built and run by test_core.py: `core_test <name>` runs one test, `core_test --list` lists them.
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "caching_allocator.h"

using namespace npudist::alloc;

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::ostringstream os_;                                                         \
      os_ << __FILE__ << ":" << __LINE__ << ": CHECK failed: " #cond;                \
      throw std::runtime_error(os_.str());                                            \
    }                                                                                 \
  } while (0)
#define CHECK_EQ(a, b)                                                                \
  do {                                                                                \
    auto va_ = (a);                                                                   \
    auto vb_ = (b);                                                                   \
    if (!(va_ == vb_)) {                                                              \
      std::ostringstream os_;                                                         \
      os_ << __FILE__ << ":" << __LINE__ << ": " #a " == " #b " failed: " << va_      \
          << " vs " << vb_;                                                           \
      throw std::runtime_error(os_.str());                                            \
    }                                                                                 \
  } while (0)

constexpr size_t MiB = 1 << 20;

// Markers complete only when the test says so, like a stream with queued work.
struct FakeMarker {
  bool done = false;
};

struct FakeHooks : DeviceHooks {
  size_t capacity = 256 * MiB;
  std::vector<std::shared_ptr<FakeMarker>> markers;
  int waits = 0;
  int device_count() override { return 2; }
  size_t device_capacity(int) override { return capacity; }
  std::shared_ptr<void> record_marker(int, int64_t) override {
    auto m = std::make_shared<FakeMarker>();
    markers.push_back(m);
    return m;
  }
  bool marker_done(const std::shared_ptr<void>& m) override {
    return static_cast<FakeMarker*>(m.get())->done;
  }
  void marker_wait(const std::shared_ptr<void>& m) override {
    ++waits;
    static_cast<FakeMarker*>(m.get())->done = true;
  }
};

struct Env {
  std::shared_ptr<FakeHooks> hooks = std::make_shared<FakeHooks>();
  std::unique_ptr<CachingAllocator> a;
  explicit Env(const std::string& conf = "", bool caching = true, size_t capacity = 256 * MiB) {
    hooks->capacity = capacity;
    a = std::make_unique<CachingAllocator>(hooks, parse_allocator_config(conf), caching);
  }
  DeviceStats st(int d = 0) { return a->stats(d); }
};

int64_t cur(const StatArray& s, StatType t = kAggregate) { return s[t].current; }
uintptr_t U(void* p) { return reinterpret_cast<uintptr_t>(p); }

// Consistency of stats with the snapshot: every byte reserved is in exactly one segment, blocks tile
// their segment, and allocated bytes equal the active_allocated blocks.
void check_invariants(CachingAllocator& a, int device = 0) {
  DeviceStats s = a.stats(device);
  size_t reserved = 0, allocated = 0;
  for (const SegmentInfo& seg : a.snapshot()) {
    if (seg.device != device) continue;
    reserved += seg.total_size;
    uintptr_t addr = seg.address;
    for (const BlockInfo& b : seg.blocks) {
      CHECK_EQ(b.address, addr);
      addr += b.size;
      if (b.state == BlockState::kActiveAllocated) allocated += b.size;
    }
    CHECK_EQ(addr, seg.address + seg.total_size);
  }
  CHECK_EQ(static_cast<int64_t>(reserved), cur(s.reserved_bytes));
  CHECK_EQ(static_cast<int64_t>(allocated), cur(s.allocated_bytes));
  CHECK_EQ(cur(s.reserved_bytes), cur(s.reserved_bytes, kSmallPool) + cur(s.reserved_bytes, kLargePool));
}

void test_rounding() {
  AllocatorConfig c;
  CHECK_EQ(round_size(c, 1), kMinBlockSize);
  CHECK_EQ(round_size(c, 512), size_t(512));
  CHECK_EQ(round_size(c, 513), size_t(1024));
  CHECK_EQ(round_size(c, 3 * MiB + 1), 3 * MiB + 512);
  CHECK_EQ(segment_size_for(4096), kSmallBuffer);
  CHECK_EQ(segment_size_for(kSmallSize), kSmallBuffer);
  CHECK_EQ(segment_size_for(kSmallSize + 512), kLargeBuffer);
  CHECK_EQ(segment_size_for(11 * MiB), 12 * MiB);
  AllocatorConfig p = parse_allocator_config("roundup_power2_divisions:4");
  // 1.2 GiB-ish requests round up to the next quarter of their power-of-two interval.
  CHECK_EQ(round_size(p, 5 * MiB), 5 * MiB);       // 4 MiB + 1 MiB steps
  CHECK_EQ(round_size(p, 5 * MiB + 1), 6 * MiB);
  CHECK_EQ(round_size(p, 1200), size_t(1536));     // too small for divisions: 512 B steps
  CHECK_EQ(round_size(p, 1200 * 1024), 1280 * size_t(1024));  // [1,2) MiB in 256 KiB steps
  AllocatorConfig l = parse_allocator_config("roundup_power2_divisions:[2:1,>:2]");
  CHECK_EQ(round_size(l, 3 * MiB + 1), 3 * MiB + 512);  // interval of 2 MiB: no divisions
  CHECK_EQ(round_size(l, 5 * MiB), 6 * MiB);            // above: halves of [4,8) MiB
}

void expect_invalid(const std::string& conf, const std::string& fragment) {
  try {
    parse_allocator_config(conf);
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    if (msg.find(fragment) == std::string::npos || msg.find("PYTORCH_NPU_ALLOC_CONF") == std::string::npos)
      throw std::runtime_error("message for '" + conf + "' lacks '" + fragment + "': " + msg);
    return;
  }
  throw std::runtime_error("config '" + conf + "' was accepted");
}

void test_config() {
  AllocatorConfig c = parse_allocator_config(
      " max_split_size_mb:128, garbage_collection_threshold:0.6,expandable_segments:True ");
  CHECK_EQ(c.max_split_size, 128 * MiB);
  CHECK(c.garbage_collection_threshold == 0.6);
  CHECK(c.expandable_segments);
  CHECK(!parse_allocator_config("").expandable_segments);
  expect_invalid("max_split_size_mb:abc", "max_split_size_mb");
  expect_invalid("max_split_size_mb:10", "greater than 20");
  expect_invalid("max_split_size_mb:-5", "max_split_size_mb");
  expect_invalid("garbage_collection_threshold:1.5", "between 0.0 and 1.0");
  expect_invalid("garbage_collection_threshold:", "garbage_collection_threshold");
  expect_invalid("expandable_segments:yes", "expandable_segments");
  expect_invalid("roundup_power2_divisions:3", "power of two");
  expect_invalid("roundup_power2_divisions:[3:2]", "not a power of two");
  expect_invalid("roundup_power2_divisions:[256:2", "unterminated");
  expect_invalid("max_split_size", "has no value");
  expect_invalid("max_spilt_size_mb:64", "unknown option 'max_spilt_size_mb'");
}

void test_small_split_and_merge() {
  Env e;
  void* a = e.a->malloc(0, 1000, 0);
  void* b = e.a->malloc(0, 1000, 0);
  void* c = e.a->malloc(0, 1000, 0);
  // One 2 MiB small segment, carved front to back in 1 KiB (rounded) blocks.
  CHECK_EQ(U(b), U(a) + 1024);
  CHECK_EQ(U(c), U(b) + 1024);
  DeviceStats s = e.st();
  CHECK_EQ(cur(s.segment), 1);
  CHECK_EQ(cur(s.reserved_bytes, kSmallPool), int64_t(kSmallBuffer));
  CHECK_EQ(cur(s.allocated_bytes), 3 * 1024);
  CHECK_EQ(cur(s.requested_bytes), 3 * 1000);
  CHECK_EQ(cur(s.inactive_split), 1);  // the free tail
  e.a->free(b);
  CHECK_EQ(cur(e.st().inactive_split), 2);
  e.a->free(a);  // merges with b's block
  CHECK_EQ(cur(e.st().inactive_split), 2);
  CHECK_EQ(cur(e.st().inactive_split_bytes), int64_t(2048 + kSmallBuffer - 3072));
  check_invariants(*e.a);
  // The merged 2 KiB hole is reused for a 2 KiB request (best fit), at a's address.
  void* d = e.a->malloc(0, 2048, 0);
  CHECK_EQ(U(d), U(a));
  e.a->free(d);
  e.a->free(c);  // everything merges back into one unsplit segment
  s = e.st();
  CHECK_EQ(cur(s.inactive_split), 0);
  CHECK_EQ(cur(s.inactive_split_bytes), 0);
  CHECK_EQ(cur(s.allocated_bytes), 0);
  CHECK_EQ(cur(s.reserved_bytes), int64_t(kSmallBuffer));
  CHECK_EQ(s.allocation[kAggregate].allocated, 4);
  CHECK_EQ(s.allocation[kAggregate].freed, 4);
  CHECK_EQ(s.allocated_bytes[kAggregate].peak, 3 * 1024);
  check_invariants(*e.a);
}

void test_large_pool_and_empty_cache() {
  Env e;
  void* a = e.a->malloc(0, 5 * MiB, 0);      // 20 MiB segment, 15 MiB cached remainder
  void* b = e.a->malloc(0, 30 * MiB + 1, 0);  // own 32 MiB segment
  DeviceStats s = e.st();
  CHECK_EQ(cur(s.reserved_bytes, kLargePool), int64_t(20 * MiB + 32 * MiB));
  CHECK_EQ(cur(s.segment, kLargePool), 2);
  void* c = e.a->malloc(0, 6 * MiB, 0);  // fits in a's segment remainder
  CHECK_EQ(U(c), U(a) + 5 * MiB);
  CHECK_EQ(cur(e.st().segment), 2);
  e.a->free(b);
  e.a->empty_cache();  // b's segment is whole and free: released; a's is in use: kept
  s = e.st();
  CHECK_EQ(cur(s.reserved_bytes), int64_t(20 * MiB));
  CHECK_EQ(s.num_device_free, 1);
  e.a->free(a);
  e.a->free(c);
  e.a->empty_cache();
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
  CHECK_EQ(e.a->mem_info(0).first, 256 * MiB);
  check_invariants(*e.a);
}

void test_stream_reuse() {
  Env e;
  void* a = e.a->malloc(0, 4096, /*stream=*/1);
  e.a->free(a);
  void* b = e.a->malloc(0, 4096, /*stream=*/2);  // other stream: never the stream-1 block
  CHECK(U(b) != U(a));
  CHECK_EQ(cur(e.st().segment), 2);
  void* c = e.a->malloc(0, 4096, 1);
  CHECK_EQ(U(c), U(a));
  e.a->free(b);
  e.a->free(c);
  check_invariants(*e.a);
}

void test_record_stream() {
  Env e;
  void* a = e.a->malloc(0, 4096, 0);
  e.a->record_stream(a, 0);  // same stream: no marker needed
  e.a->record_stream(a, 7);
  e.a->free(a);
  CHECK_EQ(e.hooks->markers.size(), size_t(1));
  CHECK_EQ(cur(e.st().allocated_bytes), 0);
  CHECK_EQ(cur(e.st().active_bytes), 4096);  // pending until stream 7 passes the marker
  bool pending = false;
  for (auto& seg : e.a->snapshot())
    for (auto& bl : seg.blocks)
      if (bl.address == U(a)) pending = bl.state == BlockState::kActivePendingFree;
  CHECK(pending);
  void* b = e.a->malloc(0, 4096, 0);
  CHECK(U(b) != U(a));
  e.hooks->markers[0]->done = true;
  void* c = e.a->malloc(0, 4096, 0);  // marker passed: a's block is reusable again
  CHECK_EQ(U(c), U(a));
  CHECK_EQ(cur(e.st().active_bytes), 2 * 4096);
  e.a->free(b);
  e.a->free(c);
  // empty_cache waits for outstanding markers instead of leaking their blocks.
  void* d = e.a->malloc(0, 4096, 0);
  e.a->record_stream(d, 3);
  e.a->free(d);
  e.a->empty_cache();
  CHECK_EQ(e.hooks->waits, 1);
  CHECK_EQ(e.st().num_sync_all_streams, 1);
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
}

void test_oom_message_and_observer() {
  Env e("", true, 64 * MiB);
  int observed = 0;
  size_t obs_free = 0;
  e.a->attach_oom_observer([&](int dev, size_t req, size_t total, size_t free) {
    CHECK_EQ(dev, 0);
    CHECK_EQ(req, 40 * MiB);
    CHECK_EQ(total, 64 * MiB);
    obs_free = free;
    ++observed;
  });
  void* a = e.a->malloc(0, 40 * MiB, 0);
  std::string msg;
  try {
    e.a->malloc(0, 40 * MiB, 0);
  } catch (const OutOfMemoryError& err) {
    msg = err.what();
  }
  CHECK(!msg.empty());
  for (const char* frag : {"NPU out of memory", "Tried to allocate 40.00 MiB", "total capacity of 64.00 MiB",
                           "24.00 MiB is free", "40.00 MiB is allocated by PyTorch",
                           "0 bytes is reserved by PyTorch but unallocated", "expandable_segments:True",
                           "max_split_size_mb"}) {
    if (msg.find(frag) == std::string::npos) throw std::runtime_error(std::string("missing '") + frag + "' in: " + msg);
  }
  CHECK_EQ(observed, 1);
  CHECK_EQ(obs_free, 24 * MiB);
  CHECK_EQ(e.st().num_ooms, 1);
  CHECK_EQ(e.st().num_alloc_retries, 1);
  e.a->free(a);
  check_invariants(*e.a);
}

void test_oom_retry_frees_cache() {
  Env e("", true, 64 * MiB);
  void* a = e.a->malloc(0, 30 * MiB, 0);
  void* s = e.a->malloc(0, 4096, 0);
  e.a->free(a);  // 30 MiB cached, 2 MiB small segment in use
  void* b = e.a->malloc(0, 50 * MiB, 0);  // only fits after the cached 30 MiB is returned
  DeviceStats st = e.st();
  CHECK_EQ(st.num_alloc_retries, 1);
  CHECK_EQ(st.num_ooms, 0);
  CHECK_EQ(cur(st.reserved_bytes), int64_t(50 * MiB + kSmallBuffer));
  e.a->free(b);
  e.a->free(s);
  check_invariants(*e.a);
}

void test_memory_fraction() {
  Env e("", true, 100 * MiB);
  e.a->set_memory_fraction(0.5, 0);
  void* a = e.a->malloc(0, 40 * MiB, 0);
  bool oom = false;
  try {
    e.a->malloc(0, 20 * MiB, 0);
  } catch (const OutOfMemoryError& err) {
    oom = std::string(err.what()).find("per-process memory fraction") != std::string::npos;
  }
  CHECK(oom);
  CHECK(e.st().num_oom_rejections >= 1);
  void* other = e.a->malloc(1, 80 * MiB, 0);  // the fraction is per device
  bool bad = false;
  try {
    e.a->set_memory_fraction(1.5, 0);
  } catch (const std::invalid_argument&) {
    bad = true;
  }
  CHECK(bad);
  e.a->free(a);
  e.a->free(other);
}

void test_max_split_size() {
  Env e("max_split_size_mb:32");
  void* big = e.a->malloc(0, 40 * MiB, 0);
  e.a->free(big);
  DeviceStats s = e.st();
  CHECK_EQ(s.max_split_size, int64_t(32 * MiB));
  CHECK_EQ(s.oversize_segments.current, 1);
  // A small-ish large request must not split the oversize cached block.
  void* a = e.a->malloc(0, 12 * MiB, 0);
  CHECK(U(a) != U(big));
  CHECK_EQ(cur(e.st().segment), 2);
  // An oversize request reuses the oversize block only if it wastes < 20 MiB.
  void* b = e.a->malloc(0, 36 * MiB, 0);
  CHECK_EQ(U(b), U(big));
  CHECK_EQ(e.st().oversize_allocations.current, 1);
  e.a->free(b);
  void* c = e.a->malloc(0, 8 * MiB, 0);  // below max_split: served from the 20 MiB path, not big
  CHECK(U(c) != U(big));
  e.a->free(a);
  e.a->free(c);
  check_invariants(*e.a);
}

void test_release_oversize_before_flush() {
  // With max_split_size set, an allocation that does not fit first frees a cached oversize block
  // that is too large to hand out (without a full flush, so no retry is counted).
  Env e("max_split_size_mb:32", true, 128 * MiB);
  void* a = e.a->malloc(0, 100 * MiB, 0);
  e.a->free(a);
  void* b = e.a->malloc(0, 40 * MiB, 0);  // 100 >= 40 + 20: not reused; no room beside it
  CHECK_EQ(e.st().num_alloc_retries, 0);
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(40 * MiB));
  CHECK_EQ(e.st().num_device_free, 1);
  e.a->free(b);
  check_invariants(*e.a);
}

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

void test_garbage_collection() {
  Env e("garbage_collection_threshold:0.5", true, 100 * MiB);
  void* a = e.a->malloc(0, 30 * MiB, 0);
  e.a->free(a);  // 30 MiB cached
  void* b = e.a->malloc(0, 24 * MiB, 1);  // other stream: new segment; reserved 54 > 50
  e.a->free(b);
  // Next miss: GC frees the cached segments that waited longest (a's, older than b's) until
  // reserved memory is back under the threshold; no OOM flush/retry is needed.
  void* c = e.a->malloc(0, 14 * MiB, 2);
  DeviceStats s = e.st();
  CHECK_EQ(cur(s.reserved_bytes), int64_t(38 * MiB));
  CHECK_EQ(s.num_alloc_retries, 0);
  CHECK_EQ(s.num_device_free, 1);
  void* d = e.a->malloc(0, 24 * MiB, 1);  // b's cached segment survived
  CHECK_EQ(U(d), U(b));
  e.a->free(d);
  e.a->free(c);
  check_invariants(*e.a);
}

void test_no_caching() {
  Env e("", false);
  void* a = e.a->malloc(0, 1000, 0);
  void* b = e.a->malloc(0, 5 * MiB, 0);
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(1024 + 5 * MiB));
  e.a->free(a);
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(5 * MiB));
  e.a->record_stream(b, 4);
  e.a->free(b);  // returned once the other stream passes its marker
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(5 * MiB));
  e.hooks->markers[0]->done = true;
  void* c = e.a->malloc(0, 512, 0);
  e.a->free(c);
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
  CHECK_EQ(e.st().num_device_alloc, 3);
}

void test_toggle_caching() {
  Env e;
  void* cached = e.a->malloc(0, 5 * MiB, 0);  // 20 MiB segment
  e.a->set_caching(false);
  void* a = e.a->malloc(0, 3 * MiB, 0);  // own exact segment, not the cached remainder
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(23 * MiB));
  e.a->free(a);
  e.a->free(cached);  // whole again: returned right away while caching is off
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
  e.a->set_caching(true);
  void* b = e.a->malloc(0, 5 * MiB, 0);
  e.a->free(b);
  CHECK_EQ(cur(e.st().reserved_bytes), int64_t(20 * MiB));
  CHECK(e.a->caching_enabled());
}

void test_history() {
  Env e;
  auto tag = std::make_shared<std::string>("ctx-a");
  void* pre = e.a->malloc(0, 100, 0);
  HistoryOptions h;
  h.record_state = h.record_trace = h.context_on_trace = true;
  h.max_entries = 100;
  e.a->record_history(h, false);
  void* a = e.a->malloc(0, 3 * MiB, 0, tag);
  e.a->free(a);
  std::vector<TraceEntry> t = e.a->traces()[0];
  std::vector<std::string> actions;
  for (auto& x : t) actions.push_back(action_name(x.action));
  std::vector<std::string> want = {"segment_alloc", "alloc", "free_requested", "free_completed"};
  CHECK(actions == want);
  CHECK(t[1].context == tag);
  CHECK(!t[2].context);  // context_on_free is off
  CHECK_EQ(t[1].size, 3 * MiB);
  CHECK(t[1].time_us > 0);
  void* b = e.a->malloc(0, 200, 0, tag);
  bool found = false;
  for (auto& seg : e.a->snapshot())
    for (auto& bl : seg.blocks)
      if (bl.address == U(b)) found = bl.context == tag && bl.requested_size == 200;
  CHECK(found);
  CHECK_EQ(std::string(action_name(e.a->traces()[0].back().action)), "snapshot");
  // Without context_on_trace stacks stay on live blocks only (context="state").
  h.context_on_trace = false;
  e.a->record_history(h, true);
  void* s1 = e.a->malloc(0, 300, 0, tag);
  CHECK(!e.a->traces()[0][0].context);
  found = false;
  for (auto& seg : e.a->snapshot())
    for (auto& bl : seg.blocks)
      if (bl.address == U(s1)) found = bl.context == tag;
  CHECK(found);
  e.a->free(s1);
  // Ring buffer: only the newest max_entries survive, oldest first.
  h.max_entries = 3;
  e.a->record_history(h, true);
  for (int i = 0; i < 4; ++i) e.a->free(e.a->malloc(0, 100, 0));
  t = e.a->traces()[0];
  CHECK_EQ(t.size(), size_t(3));
  CHECK_EQ(std::string(action_name(t[0].action)), "alloc");
  CHECK_EQ(std::string(action_name(t[2].action)), "free_completed");
  HistoryOptions off;
  e.a->record_history(off, false);
  CHECK(e.a->traces()[0].empty());
  e.a->free(b);
  e.a->free(pre);
}

void test_stats_reset() {
  Env e;
  void* a = e.a->malloc(0, 4 * MiB, 0);
  e.a->free(a);
  e.a->reset_peak_stats(0);
  CHECK_EQ(e.st().allocated_bytes[kAggregate].peak, 0);
  CHECK_EQ(e.st().reserved_bytes[kAggregate].peak, int64_t(20 * MiB));
  e.a->reset_accumulated_stats(0);
  DeviceStats s = e.st();
  CHECK_EQ(s.allocation[kAggregate].allocated, 0);
  CHECK_EQ(s.num_device_alloc, 0);
  bool bad = false;
  try {
    e.a->free(reinterpret_cast<void*>(0x1234));
  } catch (const std::invalid_argument&) {
    bad = true;
  }
  CHECK(bad);
}

void test_random_stress() {
  // Random sizes, streams and record_stream on two devices; live ranges must never overlap and
  // the stats must always agree with the snapshot.
  for (const char* conf : {"", "expandable_segments:True", "max_split_size_mb:40,roundup_power2_divisions:4"}) {
    Env e(conf, true, 512 * MiB);
    std::mt19937_64 rng(42);
    std::map<uintptr_t, std::pair<size_t, unsigned char>> live;
    std::vector<void*> ptrs;
    for (int step = 0; step < 3000; ++step) {
      if (ptrs.empty() || rng() % 100 < 55) {
        size_t size = rng() % 4 == 0 ? (rng() % (24 * MiB)) + 1 : (rng() % 40000) + 1;
        int dev = static_cast<int>(rng() % 2);
        void* p = nullptr;
        try {
          p = e.a->malloc(dev, size, static_cast<int64_t>(rng() % 3), {});
        } catch (const OutOfMemoryError&) {
          continue;
        }
        auto it = live.lower_bound(U(p));
        CHECK(it == live.end() || it->first >= U(p) + size);
        if (it != live.begin()) {
          --it;
          CHECK(it->first + it->second.first <= U(p));
        }
        unsigned char tagv = static_cast<unsigned char>(step);
        std::memset(p, tagv, size);
        live[U(p)] = {size, tagv};
        ptrs.push_back(p);
        if (rng() % 10 == 0) e.a->record_stream(p, 5);
      } else {
        size_t i = rng() % ptrs.size();
        void* p = ptrs[i];
        auto& info = live[U(p)];
        const unsigned char* c = static_cast<unsigned char*>(p);
        CHECK(c[0] == info.second && c[info.first - 1] == info.second);
        live.erase(U(p));
        ptrs.erase(ptrs.begin() + static_cast<long>(i));
        e.a->free(p);
        for (auto& m : e.hooks->markers) m->done = rng() % 2 == 0 || m->done;
      }
      if (step % 500 == 0) {
        check_invariants(*e.a, 0);
        check_invariants(*e.a, 1);
        if (step % 1000 == 0) e.a->empty_cache();
      }
    }
    for (void* p : ptrs) e.a->free(p);
    e.a->empty_cache();
    CHECK_EQ(cur(e.st(0).reserved_bytes) + cur(e.st(1).reserved_bytes), 0);
    CHECK_EQ(cur(e.st(0).allocation) + cur(e.st(1).allocation), 0);
  }
}

void test_fork_locks() {
  // lock_all/unlock_all take and release every lock (a deadlock or double unlock would hang/abort).
  Env e;
  void* a = e.a->malloc(0, 100, 0);
  e.a->lock_all();
  e.a->unlock_all();
  e.a->free(a);
  CHECK_EQ(cur(e.st().allocated_bytes), 0);
}

void test_threads() {
  // Concurrent allocate/free on shared devices (the adapter frees from any thread, e.g. stream workers).
  for (const char* conf : {"", "expandable_segments:True"}) {
    Env e(conf, true, 1024 * MiB);
    std::vector<std::thread> threads;
    std::vector<int> errors(4, 0);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&e, &errors, t] {
        std::mt19937_64 rng(t);
        std::vector<std::pair<unsigned char*, size_t>> mine;
        for (int i = 0; i < 2000; ++i) {
          if (mine.empty() || rng() % 2) {
            size_t size = rng() % 8 == 0 ? rng() % (8 * MiB) + 1 : rng() % 20000 + 1;
            auto* p = static_cast<unsigned char*>(e.a->malloc(t % 2, size, t % 3, {}));
            std::memset(p, t + 1, size);
            mine.emplace_back(p, size);
          } else {
            size_t k = rng() % mine.size();
            auto [p, size] = mine[k];
            if (p[0] != t + 1 || p[size - 1] != t + 1) errors[t]++;  // someone else wrote into our block
            e.a->free(p);
            mine.erase(mine.begin() + static_cast<long>(k));
          }
          if (i % 700 == 0) e.a->empty_cache();
        }
        for (auto& m : mine) e.a->free(m.first);
      });
    }
    for (auto& th : threads) th.join();
    for (int err : errors) CHECK_EQ(err, 0);
    check_invariants(*e.a, 0);
    check_invariants(*e.a, 1);
    CHECK_EQ(cur(e.st(0).allocated_bytes) + cur(e.st(1).allocated_bytes), 0);
  }
}

int main(int argc, char** argv) {
  std::vector<std::pair<std::string, std::function<void()>>> tests = {
      {"rounding", test_rounding},
      {"config", test_config},
      {"small_split_and_merge", test_small_split_and_merge},
      {"large_pool_and_empty_cache", test_large_pool_and_empty_cache},
      {"stream_reuse", test_stream_reuse},
      {"record_stream", test_record_stream},
      {"oom_message_and_observer", test_oom_message_and_observer},
      {"oom_retry_frees_cache", test_oom_retry_frees_cache},
      {"memory_fraction", test_memory_fraction},
      {"max_split_size", test_max_split_size},
      {"release_oversize_before_flush", test_release_oversize_before_flush},
      {"expandable_growth", test_expandable_growth},
      {"expandable_partial_release", test_expandable_partial_release},
      {"expandable_oom", test_expandable_oom},
      {"garbage_collection", test_garbage_collection},
      {"no_caching", test_no_caching},
      {"toggle_caching", test_toggle_caching},
      {"history", test_history},
      {"stats_reset", test_stats_reset},
      {"random_stress", test_random_stress},
      {"threads", test_threads},
      {"fork_locks", test_fork_locks},
  };
  if (argc > 1 && std::string(argv[1]) == "--list") {
    for (auto& t : tests) std::cout << t.first << "\n";
    return 0;
  }
  int failed = 0;
  for (auto& t : tests) {
    if (argc > 1 && t.first != argv[1]) continue;
    try {
      t.second();
      std::cout << "PASS " << t.first << "\n";
    } catch (const std::exception& ex) {
      std::cout << "FAIL " << t.first << ": " << ex.what() << "\n";
      ++failed;
    }
  }
  return failed ? 1 : 0;
}
