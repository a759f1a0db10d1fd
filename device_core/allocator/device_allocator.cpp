// Allocation and free paths of one device: the CUDA caching allocator's algorithm over DeviceHooks memory.
#include "device_allocator.h"

#include <algorithm>
#include <cassert>
#include <cstdio>

namespace npudist::alloc {

DeviceAllocator::DeviceAllocator(int device, DeviceHooks* hooks, const AllocatorConfig& cfg, bool caching)
    : device_(device), hooks_(hooks), cfg_(cfg), caching_(caching),
      capacity_(hooks->device_capacity(device)) {
  skip_.assign(static_cast<size_t>(Action::kOom) + 1, false);
  stats_.max_split_size = static_cast<int64_t>(std::min<size_t>(cfg_.max_split_size, INT64_MAX));
}

DeviceAllocator::~DeviceAllocator() {
  // Process teardown: return committed memory; live blocks' owners are gone with the process.
  for (Block* b : all_blocks()) {
    if (!b->expandable && !b->prev) {
      size_t total = 0;
      for (Block* x = b; x; x = x->next) total += x->size;
      unmap_range(b->pool, b->ptr, total, b->stream);
    }
  }
  for (Block* b : all_blocks()) delete b;
}

size_t DeviceAllocator::allowed_bytes() const {
  if (!fraction_set_) return capacity_;
  return static_cast<size_t>(fraction_ * static_cast<double>(capacity_));
}

bool DeviceAllocator::segment_fits(size_t size) {
  const size_t external = hooks_->external_bytes(device_);
  if (total_reserved_ + size + external > capacity_) return false;
  if (total_reserved_ + size > allowed_bytes()) {
    // The device still has room but this process's fraction does not: a preemptive rejection.
    if (fraction_set_) stats_.num_oom_rejections += 1;
    return false;
  }
  return true;
}

std::array<size_t, 2> DeviceAllocator::stat_types(const BlockPool* pool) const {
  return {kAggregate, pool->is_small ? kSmallPool : kLargePool};
}

Block* DeviceAllocator::malloc(size_t orig_size, int64_t stream, const Context& ctx) {
  std::unique_lock<std::mutex> lock(mu_);
  process_events();
  size_t size = round_size(cfg_, orig_size);
  const Stat& allocated = stats_.allocated_bytes[kAggregate];
  if (allocated.current + static_cast<int64_t>(size) > allocated.peak) {
    lock.unlock();
    hooks_->before_new_peak(device_, stream);
    lock.lock();
    process_events();
  }
  BlockPool* pool = pool_for(size, stream);
  AllocParams p{stream, size, caching_ ? segment_size_for(size) : size, pool, nullptr, &ctx};
  bool found = false;
  if (!caching_) {
    found = alloc_block(p, false);
  } else {
    found = get_free_block(p);
    if (!found) {
      if (cfg_.garbage_collection_threshold > 0) garbage_collect_cached_blocks(ctx, lock);
      found = alloc_block(p, false) ||
              (release_available_cached_blocks(p, lock) && alloc_block(p, false)) ||
              (release_cached_blocks(ctx, lock) && alloc_block(p, true)) || get_free_block_on_oom(p);
    }
  }
  if (!found) {
    stats_.num_ooms += 1;
    size_t device_free = capacity_ - std::min(capacity_, total_reserved_ + hooks_->external_bytes(device_));
    record_trace(Action::kOom, 0, orig_size, stream, ctx, device_free);
    std::string msg = oom_message(orig_size, p.alloc_size);
    std::vector<OomObserver> observers = oom_observers_;
    lock.unlock();
    for (auto& obs : observers) obs(device_, orig_size, capacity_, device_free);
    throw OutOfMemoryError(msg);
  }
  return alloc_found_block(p, orig_size, ctx);
}

bool DeviceAllocator::get_free_block(AllocParams& p) {
  BlockPool& pool = *p.pool;
  if (cfg_.garbage_collection_threshold > 0) ++pool.get_free_blocks_call_count;
  Block key(device_, p.stream, p.size, &pool, nullptr);
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != p.stream) return false;
  Block* b = *it;
  // Keep oversize cached blocks for oversize requests, and do not hand out one much larger than asked.
  if (p.size < cfg_.max_split_size && b->size >= cfg_.max_split_size) return false;
  if (p.size >= cfg_.max_split_size && b->size >= p.size + kLargeBuffer) return false;
  pool.blocks.erase(it);
  p.block = b;
  return true;
}

bool DeviceAllocator::alloc_block(AllocParams& p, bool is_retry) {
  if (is_retry) stats_.num_alloc_retries += 1;
  // Private pools use fixed segments: their memory must stay theirs, and a segment source hands out
  // whole segments.
  if (caching_ && cfg_.expandable_segments && !p.pool->owner) return alloc_expandable(p);
  size_t size = p.alloc_size;
  if (!segment_fits(size)) return false;
  void* ptr = map_segment_for(p, size);
  if (!ptr) return false;
  total_reserved_ += size;
  if (PrivatePool* pp = p.pool->owner) {
    pp->segments += 1;
    for (size_t t : stat_types(p.pool)) pp->reserved_bytes[t].increase(static_cast<int64_t>(size));
  }
  Block* b = new Block(device_, p.stream, size, p.pool, static_cast<char*>(ptr));
  for (size_t t : stat_types(p.pool)) {
    stats_.segment[t].increase(1);
    stats_.reserved_bytes[t].increase(static_cast<int64_t>(size));
  }
  if (size >= cfg_.max_split_size) stats_.oversize_segments.increase(1);
  stats_.num_device_alloc += 1;
  record_trace(Action::kSegmentAlloc, reinterpret_cast<uintptr_t>(ptr), size, p.stream, *p.context);
  p.block = b;
  return true;
}

bool DeviceAllocator::should_split(const Block* block, size_t size) const {
  size_t remaining = block->size - size;
  if (block->pool->owner && block->pool->owner->opts.no_split) return false;
  if (block->pool->is_small || block->expandable) return remaining >= kMinBlockSize;
  return size < cfg_.max_split_size && remaining > kSmallSize;
}

Block* DeviceAllocator::alloc_found_block(AllocParams& p, size_t orig_size, const Context& ctx) {
  Block* block = p.block;
  BlockPool* pool = p.pool;
  bool already_split = block->is_split();
  auto types = stat_types(pool);
  if (caching_ && should_split(block, p.size)) {
    // Carve the request off the front; the remainder stays cached in the pool.
    Block* remaining = block;
    block = new Block(device_, p.stream, p.size, pool, remaining->ptr);
    block->expandable = remaining->expandable;
    block->prev = remaining->prev;
    if (block->prev) block->prev->next = block;
    block->next = remaining;
    remaining->prev = block;
    remaining->ptr += p.size;
    remaining->size -= p.size;
    cache_block(pool, remaining);
    if (!block->expandable) {
      for (size_t t : types) {
        if (already_split) {
          stats_.inactive_split_bytes[t].decrease(static_cast<int64_t>(block->size));
        } else {
          stats_.inactive_split_bytes[t].increase(static_cast<int64_t>(remaining->size));
          stats_.inactive_split[t].increase(1);
        }
      }
    }
  } else if (already_split && !block->expandable) {
    for (size_t t : types) {
      stats_.inactive_split_bytes[t].decrease(static_cast<int64_t>(block->size));
      stats_.inactive_split[t].decrease(1);
    }
  }
  block->allocated = true;
  block->requested_size = orig_size;
  block->context = history_.record_state ? ctx : Context();
  active_blocks_.insert(block);
  for (size_t t : types) {
    stats_.allocation[t].increase(1);
    stats_.allocated_bytes[t].increase(static_cast<int64_t>(block->size));
    stats_.active[t].increase(1);
    stats_.active_bytes[t].increase(static_cast<int64_t>(block->size));
    stats_.requested_bytes[t].increase(static_cast<int64_t>(orig_size));
  }
  if (block->size >= cfg_.max_split_size) stats_.oversize_allocations.increase(1);
  record_trace(Action::kAlloc, reinterpret_cast<uintptr_t>(block->ptr), orig_size, block->stream, ctx);
  return block;
}

void DeviceAllocator::free(Block* block, const Context& ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  assert(block->allocated);
  block->allocated = false;
  ++frees_;
  record_trace(Action::kFreeRequested, reinterpret_cast<uintptr_t>(block->ptr), block->requested_size,
               block->stream, history_.context_on_free ? ctx : Context());
  for (size_t t : stat_types(block->pool)) {
    stats_.allocation[t].decrease(1);
    stats_.allocated_bytes[t].decrease(static_cast<int64_t>(block->size));
    stats_.requested_bytes[t].decrease(static_cast<int64_t>(block->requested_size));
  }
  if (block->size >= cfg_.max_split_size) stats_.oversize_allocations.decrease(1);
  if (!block->stream_uses.empty()) {
    insert_events(block);  // reused only after the other streams pass this point
  } else {
    free_block(block, ctx);
  }
}

void DeviceAllocator::record_stream(Block* block, int64_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stream == block->stream) return;  // same-stream order already protects the block
  block->stream_uses.insert(stream);
}

// torch_npu.erase_stream: the caller made the block's stream wait for `stream` (an event wait), so the use
// recorded by record_stream no longer needs a marker when the block is freed.
void DeviceAllocator::erase_stream(Block* block, int64_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  block->stream_uses.erase(stream);
}

void DeviceAllocator::free_block(Block* block, const Context& ctx) {
  assert(!block->allocated && block->event_count == 0 && block->stream_uses.empty());
  BlockPool* pool = block->pool;
  uintptr_t orig_ptr = reinterpret_cast<uintptr_t>(block->ptr);
  size_t orig_size = block->size, orig_requested = block->requested_size;
  int64_t net_blocks = 0, net_bytes = 0;
  for (Block* cand : {block->prev, block->next}) {
    size_t subsumed = try_merge_blocks(block, cand, pool);
    if (subsumed > 0) {
      net_blocks -= 1;
      net_bytes -= static_cast<int64_t>(subsumed);
    }
  }
  active_blocks_.erase(block);
  block->context.reset();
  block->requested_size = 0;
  block->gc_count_base = pool->get_free_blocks_call_count;
  cache_block(pool, block);
  if (block->is_split()) {
    net_blocks += 1;
    net_bytes += static_cast<int64_t>(block->size);
  }
  for (size_t t : stat_types(pool)) {
    if (!block->expandable) {
      if (net_blocks > 0) stats_.inactive_split[t].increase(net_blocks);
      if (net_blocks < 0) stats_.inactive_split[t].decrease(-net_blocks);
      if (net_bytes > 0) stats_.inactive_split_bytes[t].increase(net_bytes);
      if (net_bytes < 0) stats_.inactive_split_bytes[t].decrease(-net_bytes);
    }
    stats_.active[t].decrease(1);
    stats_.active_bytes[t].decrease(static_cast<int64_t>(orig_size));
  }
  record_trace(Action::kFreeCompleted, orig_ptr, orig_requested, block->stream, ctx);
  // Without caching every segment goes back to the device as soon as it is free.
  if (!caching_ && !block->is_split() && !block->expandable) release_block(block, ctx);
}

size_t DeviceAllocator::try_merge_blocks(Block* dst, Block* src, BlockPool* pool) {
  if (!src || src->allocated || src->event_count > 0 || !src->stream_uses.empty() ||
      dst->mapped != src->mapped)
    return 0;
  assert(dst->is_split() && src->is_split());
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  size_t subsumed = src->size;
  dst->size += subsumed;
  size_t erased = src->mapped ? pool->blocks.erase(src) : pool->unmapped.erase(src);
  assert(erased == 1);
  (void)erased;
  delete src;
  return subsumed;
}

void DeviceAllocator::insert_events(Block* block) {
  std::unordered_set<int64_t> streams;
  std::swap(streams, block->stream_uses);
  for (int64_t s : streams) {
    pending_.emplace_back(hooks_->record_marker(device_, s), block);
    block->event_count += 1;
  }
}

void DeviceAllocator::process_events() {
  if (pending_.empty()) return;
  std::deque<std::pair<std::shared_ptr<void>, Block*>> still;
  std::vector<Block*> done;
  for (auto& e : pending_) {
    if (hooks_->marker_done(e.first)) {
      done.push_back(e.second);
    } else {
      still.push_back(std::move(e));
    }
  }
  pending_.swap(still);
  for (Block* b : done) {
    if (--b->event_count == 0) free_block(b, Context());
  }
}

void DeviceAllocator::wait_pending(std::unique_lock<std::mutex>& lock) {
  if (pending_.empty()) return;
  stats_.num_sync_all_streams += 1;
  std::vector<std::shared_ptr<void>> markers;
  for (auto& e : pending_) markers.push_back(e.first);
  lock.unlock();
  for (auto& m : markers) hooks_->marker_wait(m);
  lock.lock();
  process_events();
}

void DeviceAllocator::wait_for_streams(std::unique_lock<std::mutex>& lock) {
  for (int round = 0; round < 8; ++round) {  // bounded: a host freeing without pause cannot hold it here
    const uint64_t frees = frees_;
    lock.unlock();
    hooks_->synchronize_device(device_);
    lock.lock();
    if (frees_ == frees) return;
  }
}

bool DeviceAllocator::release_available_cached_blocks(const AllocParams& p, std::unique_lock<std::mutex>& lock) {
  if (cfg_.max_split_size == SIZE_MAX) return false;
  wait_for_streams(lock);
  BlockPool& pool = *p.pool;
  // Release oversize cached blocks (never split, so only whole segments) until the request fits.
  Block key(device_, p.stream, std::max(p.size, cfg_.max_split_size), &pool, nullptr);
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != p.stream || (*it)->expandable) {
    if (it == pool.blocks.begin()) return false;
    size_t total = 0;
    --it;
    while (total < key.size && (*it)->size >= cfg_.max_split_size && (*it)->stream == p.stream &&
           !(*it)->expandable && !(*it)->is_split()) {
      Block* cur = *it;
      total += cur->size;
      bool first = it == pool.blocks.begin();
      if (!first) --it;
      release_block(cur, *p.context);
      if (first) break;
    }
    return total >= key.size;
  }
  if ((*it)->is_split()) return false;
  release_block(*it, *p.context);
  return true;
}

bool DeviceAllocator::release_cached_blocks(const Context& ctx, std::unique_lock<std::mutex>& lock) {
  wait_pending(lock);
  wait_for_streams(lock);
  release_blocks(&large_, ctx);
  release_blocks(&small_, ctx);
  release_freeable_pools(ctx);
  return true;
}

void DeviceAllocator::release_blocks(BlockPool* pool, const Context& ctx) {
  std::vector<Block*> todo(pool->blocks.begin(), pool->blocks.end());
  for (Block* b : todo) {
    if (b->expandable) {
      release_expandable_pages(b, ctx);
    } else if (!b->is_split()) {
      release_block(b, ctx);
    }
  }
}

void DeviceAllocator::release_block(Block* block, const Context& ctx) {
  assert(!block->is_split() && !block->expandable);
  unmap_range(block->pool, block->ptr, block->size, block->stream);
  total_reserved_ -= block->size;
  if (PrivatePool* pp = block->pool->owner) {
    pp->segments -= 1;
    for (size_t t : stat_types(block->pool)) pp->reserved_bytes[t].decrease(static_cast<int64_t>(block->size));
  }
  for (size_t t : stat_types(block->pool)) {
    stats_.segment[t].decrease(1);
    stats_.reserved_bytes[t].decrease(static_cast<int64_t>(block->size));
  }
  if (block->size >= cfg_.max_split_size) stats_.oversize_segments.decrease(1);
  stats_.num_device_free += 1;
  record_trace(Action::kSegmentFree, reinterpret_cast<uintptr_t>(block->ptr), block->size,
               block->stream, ctx);
  block->pool->blocks.erase(block);
  delete block;
}

void DeviceAllocator::garbage_collect_cached_blocks(const Context& ctx, std::unique_lock<std::mutex>& lock) {
  // Free whole cached segments that have waited longest for reuse, once reserved memory passes the
  // threshold, so that allocations do not reach the OOM path (and its full cache flush).
  size_t threshold = static_cast<size_t>(cfg_.garbage_collection_threshold *
                                         static_cast<double>(allowed_bytes()));
  if (total_reserved_ <= threshold) return;
  wait_for_streams(lock);
  if (total_reserved_ <= threshold) return;
  size_t target = total_reserved_ - threshold, reclaimed = 0;
  double total_age = 0;
  size_t freeable = 0;
  auto age = [&](const Block* b) {
    return static_cast<double>(large_.get_free_blocks_call_count - b->gc_count_base);
  };
  for (Block* b : large_.blocks) {
    if (!b->is_split() && !b->expandable) {
      total_age += age(b);
      ++freeable;
    }
  }
  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    double threshold_age = total_age / static_cast<double>(freeable);
    freed = false;
    std::vector<Block*> todo(large_.blocks.begin(), large_.blocks.end());
    for (Block* b : todo) {
      if (b->is_split() || b->expandable || age(b) < threshold_age) continue;
      freed = true;
      reclaimed += b->size;
      total_age -= age(b);
      --freeable;
      release_block(b, ctx);
    }
  }
}

void DeviceAllocator::empty_cache() {
  std::unique_lock<std::mutex> lock(mu_);
  release_cached_blocks(Context(), lock);
}

namespace {
std::string format_size(size_t bytes) {
  char buf[64];
  double b = static_cast<double>(bytes);
  if (bytes < 1024) {
    std::snprintf(buf, sizeof(buf), "%zu bytes", bytes);
  } else if (bytes < (size_t(1) << 20)) {
    std::snprintf(buf, sizeof(buf), "%.2f KiB", b / 1024.0);
  } else if (bytes < (size_t(1) << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / 1048576.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / 1073741824.0);
  }
  return buf;
}
}  // namespace

std::string DeviceAllocator::oom_message(size_t orig_size, size_t alloc_size) const {
  size_t allocated = static_cast<size_t>(stats_.allocated_bytes[kAggregate].current);
  size_t reserved = total_reserved_;
  const size_t external = hooks_->external_bytes(device_);
  size_t device_free = capacity_ - std::min(capacity_, reserved + external);
  std::string m = "NPU out of memory. Tried to allocate " + format_size(orig_size) + ". NPU " +
                  std::to_string(device_) + " has a total capacity of " + format_size(capacity_) +
                  " of which " + format_size(device_free) + " is free. ";
  if (external) {
    // CUDA's wording for memory the process holds outside PyTorch, then who holds it.
    m += "Including non-PyTorch memory, this process has " + format_size(reserved + external) +
         " memory in use, of which " + format_size(external) + " is held outside PyTorch: " +
         hooks_->external_description(device_) + ". ";
  }
  if (fraction_set_)
    m += "The per-process memory fraction limits this process to " + format_size(allowed_bytes()) +
         " (torch.npu.set_per_process_memory_fraction). ";
  m += "Of the allocated memory " + format_size(allocated) + " is allocated by PyTorch, and " +
       format_size(reserved - std::min(reserved, allocated)) +
       " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
       "setting PYTORCH_NPU_ALLOC_CONF=expandable_segments:True to avoid fragmentation, or "
       "max_split_size_mb:<MiB> to stop splitting large cached blocks. See "
       "torch.npu.memory_summary() and torch.npu.memory._snapshot() for details.";
  (void)alloc_size;
  return m;
}

}  // namespace npudist::alloc
