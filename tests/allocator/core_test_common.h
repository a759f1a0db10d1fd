// Shared helpers of the allocator core unit tests (core_test_*.cpp): checks, faked device hooks, an
// allocator environment, the stats/snapshot invariant, and the test registry used by core_test_main.cpp.
#pragma once
#include <sys/mman.h>

#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "caching_allocator.h"

using namespace npudist::alloc;  // NOLINT: test code

// Every core_test_*.cpp registers its tests here; `core_test <name>` runs one, `--list` lists them.
using CoreTest = std::pair<const char*, void (*)()>;
std::vector<CoreTest>& core_tests();
struct RegisterCoreTests {
  RegisterCoreTests(std::initializer_list<CoreTest> tests) {
    for (const auto& t : tests) core_tests().push_back(t);
  }
};

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

inline constexpr size_t MiB = 1 << 20;

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
  // Device synchronizations per device, and what the test observes at each (e.g. which segments are still mapped).
  std::map<int, int> device_syncs;
  std::function<void(int device)> on_device_sync;
  void synchronize_device(int device) override {
    ++device_syncs[device];
    if (on_device_sync) on_device_sync(device);
  }
  // before_new_peak calls as (device, stream), and what the test does there (e.g. free a block that queued work
  // held, as the runtime's hook does by releasing finished kernels).
  // Called with the allocator's lock released, so from several threads at once in the threaded tests.
  std::mutex peak_mu;
  std::vector<std::pair<int, int64_t>> peak_calls;
  std::function<void(int device)> on_new_peak;
  void before_new_peak(int device, int64_t stream) override {
    {
      std::lock_guard<std::mutex> lock(peak_mu);
      peak_calls.emplace_back(device, stream);
    }
    if (on_new_peak) on_new_peak(device);
  }
  // Device memory faked with host mappings (what the emulated runtime does, without shareable segments).
  void* map_segment(int, size_t size) override {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void unmap_segment(void* ptr, size_t size) override { munmap(ptr, size); }
  void* reserve_address(size_t size) override {
    void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void release_address(void* base, size_t size) override { munmap(base, size); }
  bool commit_pages(void* ptr, size_t size) override { return mprotect(ptr, size, PROT_READ | PROT_WRITE) == 0; }
  void decommit_pages(void* ptr, size_t size) override {
    mmap(ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
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

inline int64_t cur(const StatArray& s, StatType t = kAggregate) { return s[t].current; }
inline uintptr_t U(void* p) { return reinterpret_cast<uintptr_t>(p); }

// Consistency of stats with the snapshot: every byte reserved is in exactly one segment, blocks tile
// their segment, and allocated bytes equal the active_allocated blocks.
inline void check_invariants(CachingAllocator& a, int device = 0) {
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
