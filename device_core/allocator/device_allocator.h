// Per-device state of the caching allocator (internal to device_core/allocator).
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_set>
#include <vector>

#include "caching_allocator.h"
#include "expandable_region.h"

namespace npudist::alloc {

struct BlockPool;

// A contiguous chunk of a segment. Blocks of one segment form a doubly linked list in address order;
// an expandable segment's list also holds unmapped (not committed) blocks.
struct ExpandableSegment {
  std::unique_ptr<ExpandableRegion> region;
  int64_t stream;
  BlockPool* pool;
  size_t mapped_bytes = 0;
};

struct Block {
  int device;
  int64_t stream;
  size_t size;
  size_t requested_size = 0;
  BlockPool* pool;
  char* ptr;
  bool allocated = false;
  bool mapped = true;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::unordered_set<int64_t> stream_uses;  // other streams that used this block (record_stream)
  int event_count = 0;                      // outstanding markers before it may be reused
  int64_t gc_count_base = 0;                // pool's free-block searches when it became free
  uint64_t free_seq = UINT64_MAX;           // when it entered its pool's free set (a lookup key: before all)
  Context context;
  ExpandableSegment* expandable = nullptr;

  Block(int d, int64_t s, size_t sz, BlockPool* p, char* ptr_)
      : device(d), stream(s), size(sz), pool(p), ptr(ptr_) {}
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct BlockCmp {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    // Among equal sizes the most recently freed first: its cache lines are the likeliest still warm, which is
    // where a queued stream's locality comes from (the host is never stalled for it).
    if (a->free_seq != b->free_seq) return a->free_seq > b->free_seq;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

struct PrivatePool;

struct BlockPool {
  BlockPool(bool small, PrivatePool* owner_ = nullptr) : is_small(small), owner(owner_) {}
  std::set<Block*, BlockCmp> blocks;    // free, mapped, reusable
  std::set<Block*, BlockCmp> unmapped;  // address space of expandable segments not yet committed
  bool is_small;
  PrivatePool* owner;  // null for the default pools
  int64_t get_free_blocks_call_count = 0;
};

// A private pool: its own small and large pools, whose segments no other allocation uses.
struct PrivatePool {
  PrivatePool(PoolId id_, PoolOptions opts_) : id(id_), opts(std::move(opts_)) {}
  PoolId id;
  PoolOptions opts;
  int use_count = 1;
  size_t segments = 0;  // fixed segments it holds (it can be forgotten only at 0)
  BlockPool large{false, this};
  BlockPool small{true, this};
  StatArray reserved_bytes;
};

struct AllocParams {
  int64_t stream;
  size_t size;        // rounded request
  size_t alloc_size;  // segment size if a new segment is needed
  BlockPool* pool;
  Block* block = nullptr;
  const Context* context;
};

class DeviceAllocator {
 public:
  DeviceAllocator(int device, DeviceHooks* hooks, const AllocatorConfig& cfg, bool caching);
  ~DeviceAllocator();

  Block* malloc(size_t size, int64_t stream, const Context& ctx);
  void free(Block* block, const Context& ctx);
  void record_stream(Block* block, int64_t stream);
  void erase_stream(Block* block, int64_t stream);
  void empty_cache();
  void empty_cache(PoolId pool);

  void create_pool(PoolId pool, const PoolOptions& opts);
  void begin_allocate_to_pool(PoolId pool, PoolFilter filter);
  void end_allocate_to_pool(PoolId pool);
  void release_pool(PoolId pool);
  int pool_use_count(PoolId pool);

  DeviceStats stats();
  void reset_peak_stats();
  void reset_accumulated_stats();
  void set_memory_fraction(double fraction);
  double memory_fraction();
  std::pair<size_t, size_t> mem_info();
  void set_config(const AllocatorConfig& cfg);
  void set_caching(bool enabled);

  std::vector<SegmentInfo> snapshot();
  std::vector<TraceEntry> trace();
  void record_history(const HistoryOptions& opts, bool clear);
  void attach_oom_observer(OomObserver obs);
  std::mutex& mutex() { return mu_; }

 private:
  // All private helpers run with mu_ held.
  size_t capacity() const { return capacity_; }
  size_t allowed_bytes() const;
  // Whether `size` more bytes of segments fit: within the per-process fraction and, beside the memory the
  // process holds outside the allocator (external_bytes), within the device. Counts fraction rejections.
  bool segment_fits(size_t size);
  std::array<size_t, 2> stat_types(const BlockPool* pool) const;
  bool get_free_block(AllocParams& p);
  // Puts a free block into its pool's free set, stamped as the most recently freed.
  void cache_block(BlockPool* pool, Block* block) {
    block->free_seq = ++free_seq_;
    pool->blocks.insert(block);
  }
  bool alloc_block(AllocParams& p, bool is_retry);
  bool alloc_expandable(AllocParams& p);
  ExpandableSegment* expandable_for(int64_t stream, BlockPool* pool);
  Block* alloc_found_block(AllocParams& p, size_t orig_size, const Context& ctx);
  bool should_split(const Block* block, size_t size) const;
  void free_block(Block* block, const Context& ctx);
  size_t try_merge_blocks(Block* dst, Block* src, BlockPool* pool);
  void insert_events(Block* block);
  void process_events();
  // Waits for every outstanding marker with mu_ released (a stream's host function may itself free
  // npu memory), then frees the blocks that waited on them.
  void wait_pending(std::unique_lock<std::mutex>& lock);
  // Before segments go back to the device: waits, mu_ released, until the device's streams ran what was queued
  // (DeviceHooks::synchronize_device), again if the host freed blocks meanwhile (kernels queued before such a
  // free may use them).
  void wait_for_streams(std::unique_lock<std::mutex>& lock);
  bool release_available_cached_blocks(const AllocParams& p, std::unique_lock<std::mutex>& lock);
  bool release_cached_blocks(const Context& ctx, std::unique_lock<std::mutex>& lock);
  // device_private_pools.cpp
  BlockPool* pool_for(size_t size, int64_t stream);
  bool get_free_block_on_oom(AllocParams& p);
  void create_or_incref_pool(PoolId pool, const PoolOptions& opts);
  void release_private_pool_blocks(PrivatePool* pp, const Context& ctx);
  void release_freeable_pools(const Context& ctx);
  void* map_segment_for(const AllocParams& p, size_t size);
  void unmap_range(BlockPool* pool, void* ptr, size_t size, int64_t stream);
  void release_blocks(BlockPool* pool, const Context& ctx);
  void release_block(Block* block, const Context& ctx);
  void release_expandable_pages(Block* block, const Context& ctx);
  void garbage_collect_cached_blocks(const Context& ctx, std::unique_lock<std::mutex>& lock);
  void record_trace(Action a, uintptr_t addr, size_t size, int64_t stream, const Context& ctx,
                    size_t device_free = 0);
  std::string oom_message(size_t orig_size, size_t alloc_size) const;
  std::vector<Block*> all_blocks() const;

  int device_;
  DeviceHooks* hooks_;
  AllocatorConfig cfg_;
  bool caching_;
  size_t capacity_;
  double fraction_ = 1.0;
  bool fraction_set_ = false;
  std::mutex mu_;
  DeviceStats stats_;
  BlockPool large_{false};
  BlockPool small_{true};
  std::unordered_set<Block*> active_blocks_;
  std::deque<std::pair<std::shared_ptr<void>, Block*>> pending_;  // marker, block awaiting it
  size_t total_reserved_ = 0;
  uint64_t frees_ = 0;  // blocks freed by the host so far (wait_for_streams)
  uint64_t free_seq_ = 0;  // the last Block::free_seq handed out
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_;
  HistoryOptions history_;
  std::vector<bool> skip_;  // by Action
  std::vector<TraceEntry> trace_;
  size_t trace_next_ = 0;
  std::vector<OomObserver> oom_observers_;
  std::map<PoolId, std::unique_ptr<PrivatePool>> private_pools_;
  std::vector<std::pair<PoolId, PoolFilter>> allocating_to_;  // begin_allocate_to_pool, oldest first
};

}  // namespace npudist::alloc
