// NPU caching allocator core: pools, rounding, split/merge, per-stream reuse, stats, history.
// Plain C++17 without torch headers (unit-tested directly by tests/allocator/core_test_*.cpp); the torch
// adapter (npu_caching_allocator.cpp) wraps it as a c10::DeviceAllocator. Modelled on PyTorch's
// CUDACachingAllocator / torch_npu's NPUCachingAllocator, over the device memory DeviceHooks provides.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "alloc_config.h"

namespace npudist::alloc {

// Opaque allocation context (a captured stack trace); the core only stores and returns it.
using Context = std::shared_ptr<void>;

// A private pool's id, c10::MempoolId_t's layout: (0, n) for a user-created MemPool, (n, 0) for a graph's.
// (0, 0) is the default pools.
using PoolId = std::pair<uint64_t, uint64_t>;
// Chooses, per allocation, whether it goes to a private pool; called on the allocating thread with the
// allocation's stream (a MemPool routes the current thread, a graph capture its stream).
using PoolFilter = std::function<bool(int64_t stream)>;
// Where a private pool's segments come from when not from the device (MemPool(allocator=...)): the
// pool still caches, splits and merges inside them; the source sees whole segments only.
struct SegmentSource {
  std::function<void*(int device, size_t size, int64_t stream)> alloc;  // nullptr when it has no memory
  std::function<void(void* ptr, size_t size, int device, int64_t stream)> free;
};
// Options of a private pool (torch.cuda.MemPool's arguments).
struct PoolOptions {
  std::shared_ptr<SegmentSource> source;  // null: device memory through the hooks
  bool use_on_oom = false;  // its free blocks serve other allocations when the device is otherwise full
  bool no_split = false;    // a segment of this pool serves one allocation (never split)
};

// What the core needs from the device runtime, injected so unit tests can fake it.
class DeviceHooks {
 public:
  virtual ~DeviceHooks() = default;
  virtual int device_count() = 0;
  virtual size_t device_capacity(int device) = 0;
  // A marker is done once the stream has run everything enqueued before record_marker.
  virtual std::shared_ptr<void> record_marker(int device, int64_t stream) = 0;
  virtual bool marker_done(const std::shared_ptr<void>& marker) = 0;
  virtual void marker_wait(const std::shared_ptr<void>& marker) = 0;
  // Wait until every stream of `device` ran everything enqueued on it so far. Called (allocator lock released)
  // before cached memory goes back to the device: a block freed by the host returns to its stream's pool at once
  // even while kernels queued on that stream still read or write it (stream-ordered reuse, docs/memory.md), so
  // its segment may leave only once they ran, as cudaFree synchronizes the device.
  virtual void synchronize_device(int device) = 0;
  // Called (allocator lock released) before an allocation that would raise the device's peak of allocated bytes
  // (max_memory_allocated). Memory that the host has dropped but queued work still holds (another stream's work)
  // would otherwise set a peak that running in step with the device never reaches; the hook may wait for that
  // work to run and release what it held (docs/memory.md, "Peak memory"). Default: nothing.
  virtual void before_new_peak(int /*device*/, int64_t /*stream*/) {}
  // Device memory: a fixed segment (nullptr when the device cannot provide it) ...
  virtual void* map_segment(int device, size_t size) = 0;
  virtual void unmap_segment(void* ptr, size_t size) = 0;
  // ... or address space (nullptr on failure) in which granularity-aligned page ranges are committed
  // (false if the device refuses) and decommitted.
  virtual void* reserve_address(size_t size) = 0;
  virtual void release_address(void* base, size_t size) = 0;
  virtual bool commit_pages(void* ptr, size_t size) = 0;
  virtual void decommit_pages(void* ptr, size_t size) = 0;
  // Device memory the process holds on `device` outside the allocator (collective communicators' buffers,
  // HCCL's 2 x HCCL_BUFFSIZE each): segments must fit beside it, as cudaMalloc's must fit beside NCCL's.
  virtual size_t external_bytes(int /*device*/) { return 0; }
  // Who holds it, for the out-of-memory message; empty when nothing does.
  virtual std::string external_description(int /*device*/) { return {}; }
};

struct Stat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void increase(int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void decrease(int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_accumulated() { allocated = freed = 0; }
  void reset_peak() { peak = current; }
};

enum StatType : size_t { kAggregate = 0, kSmallPool = 1, kLargePool = 2, kNumStatTypes = 3 };
using StatArray = std::array<Stat, kNumStatTypes>;

// Same fields as c10::CachingDeviceAllocator::DeviceStats (torch.cuda.memory_stats keys).
struct DeviceStats {
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries = 0, num_ooms = 0, num_sync_all_streams = 0;
  int64_t num_device_alloc = 0, num_device_free = 0, num_oom_rejections = 0;
  Stat oversize_allocations, oversize_segments;
  int64_t max_split_size = 0;
  // reserved_bytes of each live private pool (counted in reserved_bytes too).
  std::vector<std::pair<PoolId, StatArray>> reserved_bytes_by_private_pools;
};

enum class Action {
  kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree, kSegmentMap, kSegmentUnmap,
  kSnapshot, kOom
};
const char* action_name(Action a);           // the torch.cuda snapshot spelling, e.g. "free_requested"
bool parse_action(const std::string& s, Action* out);

struct TraceEntry {
  Action action;
  uintptr_t addr = 0;
  size_t size = 0;
  int64_t stream = 0;
  Context context;
  int64_t time_us = 0;
  size_t device_free = 0;  // only for kOom
};

enum class BlockState { kActiveAllocated, kActivePendingFree, kInactive };

struct BlockInfo {
  uintptr_t address;
  size_t size, requested_size;
  BlockState state;
  Context context;
};

struct SegmentInfo {
  int device;
  uintptr_t address;
  size_t total_size = 0, allocated_size = 0, active_size = 0, requested_size = 0;
  int64_t stream;
  bool is_large, is_expandable;
  std::vector<BlockInfo> blocks;
  PoolId pool_id{0, 0};
};

// _record_memory_history settings.
struct HistoryOptions {
  bool record_state = false;    // keep contexts on live blocks
  bool record_trace = false;    // keep the alloc/free event ring buffer
  bool context_on_trace = false;  // contexts on trace entries (alloc, segment events)
  bool context_on_free = false;   // contexts on free_requested entries too
  size_t max_entries = SIZE_MAX;
  std::vector<Action> skip;
};

class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Called (outside the allocator lock) before an OutOfMemoryError is thrown.
using OomObserver = std::function<void(int device, size_t requested, size_t device_total,
                                       size_t device_free)>;

class DeviceAllocator;
struct Block;

class CachingAllocator {
 public:
  CachingAllocator(std::shared_ptr<DeviceHooks> hooks, AllocatorConfig cfg, bool caching_enabled);
  ~CachingAllocator();

  // size 0 returns nullptr. Throws OutOfMemoryError when the device is full even after freeing caches.
  void* malloc(int device, size_t size, int64_t stream, const Context& ctx = {});
  // Throws std::invalid_argument for a pointer this allocator did not return.
  void free(void* ptr, const Context& ctx = {});
  void record_stream(void* ptr, int64_t stream);
  // Undoes record_stream(ptr, stream) for a live block (torch_npu.erase_stream). Throws like record_stream.
  void erase_stream(void* ptr, int64_t stream);
  bool owns(void* ptr);
  // The stream a live block was allocated on (the stream whose pool it returns to when freed); -1 for a pointer
  // this allocator did not return.
  int64_t stream_of(void* ptr);
  int device_count() const { return static_cast<int>(devices_.size()); }

  // Returns the unused segments of the default pools and of private pools nobody uses any more.
  void empty_cache();
  // Returns the unused segments of one private pool on every device (a pool still in use keeps
  // allocating; a released one is forgotten once it holds no segment).
  void empty_cache(PoolId pool);

  // Private pools (the caching allocator's; MemPool and graph capture). A pool is created on first use
  // with a use count of 1; each create/begin adds one and each release drops one. Its segments serve
  // only allocations routed to it, and come back to the device only once its use count is 0 (empty_cache).
  // Throws std::invalid_argument for a pool id of (0, 0) or options that contradict an existing pool.
  void create_pool(int device, PoolId pool, const PoolOptions& opts = {});
  // Routes allocations on `device` for which `filter` says yes into `pool` (creating or increfing it),
  // until end_allocate_to_pool. Throws std::invalid_argument if allocations already go to `pool`.
  void begin_allocate_to_pool(int device, PoolId pool, PoolFilter filter);
  void end_allocate_to_pool(int device, PoolId pool);
  void release_pool(int device, PoolId pool);
  int pool_use_count(int device, PoolId pool);  // 0 if the device has no such pool
  DeviceStats stats(int device);
  void reset_peak_stats(int device);
  void reset_accumulated_stats(int device);
  void set_memory_fraction(double fraction, int device);
  double memory_fraction(int device);
  std::pair<size_t, size_t> mem_info(int device);  // (free, total) device bytes

  std::vector<SegmentInfo> snapshot();
  std::vector<std::vector<TraceEntry>> traces();
  void record_history(const HistoryOptions& opts, bool clear);
  HistoryOptions history();
  void attach_oom_observer(OomObserver obs);

  void set_config(const AllocatorConfig& cfg);
  AllocatorConfig config();
  bool caching_enabled() const { return caching_.load(); }
  // caching_allocator_enable: while off, allocations map their own segment and frees return it.
  void set_caching(bool enabled);

  // Fork safety: hold every allocator lock across fork() so the child never inherits one mid-update.
  void lock_all();
  void unlock_all();

 private:
  DeviceAllocator& dev(int device);
  Block* live_block(void* ptr, const char* what);  // throws std::invalid_argument naming `what`
  std::shared_ptr<DeviceHooks> hooks_;
  std::atomic<bool> caching_;
  std::vector<std::unique_ptr<DeviceAllocator>> devices_;
  std::mutex map_mu_;
  std::unordered_map<void*, Block*> live_;  // allocated pointer -> block
  std::mutex cfg_mu_;
  AllocatorConfig cfg_;
  HistoryOptions history_;
};

}  // namespace npudist::alloc
