// Allocator core unit tests. Stream-ordered reuse (docs/memory.md): a freed block serves its stream's next
// allocation at once, while segments return to the device only after the device's streams ran what was queued.
#include "core_test_common.h"

namespace {

// Whether `ptr` lies in a segment the allocator still holds.
bool mapped(CachingAllocator& a, void* ptr) {
  for (const SegmentInfo& seg : a.snapshot()) {
    if (U(ptr) >= seg.address && U(ptr) < seg.address + seg.total_size) return true;
  }
  return false;
}

void test_freed_block_serves_its_stream_at_once() {
  Env e;
  void* a = e.a->malloc(0, 1 * MiB, /*stream=*/3);
  CHECK_EQ(e.a->stream_of(a), int64_t{3});
  e.a->free(a);  // queued kernels of stream 3 may still use it: later work on stream 3 runs after them
  CHECK_EQ(e.a->stream_of(a), int64_t{-1});
  void* b = e.a->malloc(0, 1 * MiB, 3);
  CHECK_EQ(U(b), U(a));
  CHECK(e.hooks->device_syncs.empty());  // reuse on the same stream never waits
  CHECK_EQ(e.hooks->waits, 0);
  e.a->free(b);
  check_invariants(*e.a);
}

void test_empty_cache_waits_for_the_streams_before_unmapping() {
  Env e;
  void* a = e.a->malloc(0, 4 * MiB, 0);
  e.a->free(a);
  bool mapped_at_sync = false;
  e.hooks->on_device_sync = [&](int device) {
    if (device == 0) mapped_at_sync = mapped(*e.a, a);
  };
  e.a->empty_cache();
  CHECK(e.hooks->device_syncs[0] >= 1);
  CHECK(mapped_at_sync);  // the segment was still there while the streams drained
  CHECK(!mapped(*e.a, a));
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
}

void test_oom_release_waits_for_the_streams() {
  Env e("", true, 64 * MiB);
  void* a = e.a->malloc(0, 40 * MiB, 0);
  e.a->free(a);  // cached on stream 0; stream 1 cannot have it without the segment going back
  void* b = e.a->malloc(0, 40 * MiB, 1);
  CHECK(b != nullptr);
  CHECK(e.hooks->device_syncs[0] >= 1);
  e.a->free(b);
  check_invariants(*e.a);
}

void test_a_free_during_the_wait_waits_again() {
  Env e;
  void* a = e.a->malloc(0, 2 * MiB, 0);
  void* b = e.a->malloc(0, 2 * MiB, 0);
  e.a->free(a);
  // Another host thread frees `b` while the allocator waits: kernels queued before that free may use it.
  e.hooks->on_device_sync = [&](int device) {
    if (device == 0 && e.hooks->device_syncs[0] == 1) std::thread([&] { e.a->free(b); }).join();
  };
  e.a->empty_cache();
  CHECK_EQ(e.hooks->device_syncs[0], 2);
  CHECK_EQ(cur(e.st().reserved_bytes), 0);
}

void test_disabling_caching_waits_for_the_streams() {
  Env e;
  void* a = e.a->malloc(0, 1 * MiB, 0);
  e.a->free(a);
  e.a->set_caching(false);  // from now on a free unmaps at once
  CHECK_EQ(e.hooks->device_syncs[0], 1);
  e.a->set_caching(false);  // already off: nothing new to wait for
  CHECK_EQ(e.hooks->device_syncs[0], 1);
  e.a->empty_cache();
}

// Among free blocks that fit equally well, the most recently freed is handed out (its lines are the warmest);
// a better fit still wins over recency.
void test_most_recently_freed_first_among_equal_fits() {
  Env e;
  void* a = e.a->malloc(0, 4096, 0);
  void* x = e.a->malloc(0, 4096, 0);  // keeps a and b apart, so neither merges
  void* b = e.a->malloc(0, 4096, 0);
  void* y = e.a->malloc(0, 4096, 0);
  CHECK(U(a) < U(b));
  e.a->free(a);
  e.a->free(b);
  void* c = e.a->malloc(0, 4096, 0);
  CHECK_EQ(U(c), U(b));  // address order would give a
  e.a->free(c);
  void* z = e.a->malloc(0, 8192, 0);  // separated from y by nothing free: the remainder after it stays apart
  void* w = e.a->malloc(0, 4096, 0);
  e.a->free(z);  // now an 8 KiB block is the most recent; a 4 KiB request still takes a 4 KiB block
  void* d = e.a->malloc(0, 4096, 0);
  CHECK(U(d) == U(a) || U(d) == U(b));
  for (void* p : {x, y, w, d}) e.a->free(p);
  check_invariants(*e.a);
}

// An allocation that would raise the peak of allocated bytes first calls before_new_peak, lock released: what
// the hook frees there (memory queued work held) is reused and the peak stays. Below the peak nothing is called.
void test_new_peak_calls_the_hook_first() {
  Env e;
  void* a = e.a->malloc(0, 4 * MiB, 0);
  CHECK_EQ(e.hooks->peak_calls.size(), size_t{1});  // 0 + 4 MiB > a peak of 0
  CHECK_EQ(e.hooks->peak_calls[0].second, int64_t{0});
  e.a->free(a);
  void* b = e.a->malloc(0, 4 * MiB, 0);  // back to the peak, not above it
  CHECK_EQ(e.hooks->peak_calls.size(), size_t{1});
  // b is dropped by the host but held by queued work until the hook lets it go.
  e.hooks->on_new_peak = [&](int) {
    if (b) e.a->free(b);
    b = nullptr;
  };
  void* c = e.a->malloc(0, 4 * MiB, 7);
  CHECK_EQ(e.hooks->peak_calls.size(), size_t{2});
  CHECK_EQ(e.hooks->peak_calls[1].second, int64_t{7});
  CHECK_EQ(e.st().allocated_bytes[kAggregate].peak, int64_t{4 * MiB});  // b's 4 MiB went first
  e.a->free(c);
  e.a->reset_peak_stats(0);  // the peak is max_memory_allocated's: a reset lowers the bar
  void* d = e.a->malloc(0, 1 * MiB, 0);
  CHECK_EQ(e.hooks->peak_calls.size(), size_t{3});
  e.a->free(d);
  check_invariants(*e.a);
}

RegisterCoreTests reg_stream_order({
    {"new_peak_calls_the_hook_first", test_new_peak_calls_the_hook_first},
    {"most_recently_freed_first_among_equal_fits", test_most_recently_freed_first_among_equal_fits},
    {"freed_block_serves_its_stream_at_once", test_freed_block_serves_its_stream_at_once},
    {"empty_cache_waits_for_the_streams_before_unmapping", test_empty_cache_waits_for_the_streams_before_unmapping},
    {"oom_release_waits_for_the_streams", test_oom_release_waits_for_the_streams},
    {"a_free_during_the_wait_waits_again", test_a_free_during_the_wait_waits_again},
    {"disabling_caching_waits_for_the_streams", test_disabling_caching_waits_for_the_streams},
});

}  // namespace
