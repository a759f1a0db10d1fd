// Allocator core unit tests. Statistics and history: the allocation history, stats reset, a random stress run against the invariant.
#include "core_test_common.h"

namespace {

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

}  // namespace

static RegisterCoreTests registered{
    {"history", test_history},
    {"stats_reset", test_stats_reset},
    {"random_stress", test_random_stress},
};
