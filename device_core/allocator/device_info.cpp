// Introspection of one device: stats, limits, snapshots and the alloc/free history ring buffer.
#include <algorithm>
#include <chrono>

#include "device_allocator.h"

namespace npudist::alloc {

DeviceStats DeviceAllocator::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceStats out = stats_;
  for (const auto& [id, pp] : private_pools_) out.reserved_bytes_by_private_pools.emplace_back(id, pp->reserved_bytes);
  return out;
}

void DeviceAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes})
    for (Stat& s : *a) s.reset_peak();
  for (auto& [id, pp] : private_pools_)
    for (Stat& s : pp->reserved_bytes) s.reset_peak();
  stats_.oversize_allocations.reset_peak();
  stats_.oversize_segments.reset_peak();
}

void DeviceAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes})
    for (Stat& s : *a) s.reset_accumulated();
  for (auto& [id, pp] : private_pools_)
    for (Stat& s : pp->reserved_bytes) s.reset_accumulated();
  stats_.oversize_allocations.reset_accumulated();
  stats_.oversize_segments.reset_accumulated();
  stats_.num_alloc_retries = stats_.num_ooms = stats_.num_sync_all_streams = 0;
  stats_.num_device_alloc = stats_.num_device_free = stats_.num_oom_rejections = 0;
}

void DeviceAllocator::set_memory_fraction(double fraction) {
  std::lock_guard<std::mutex> lock(mu_);
  fraction_ = fraction;
  fraction_set_ = true;
}

double DeviceAllocator::memory_fraction() {
  std::lock_guard<std::mutex> lock(mu_);
  return fraction_;
}

std::pair<size_t, size_t> DeviceAllocator::mem_info() {
  std::lock_guard<std::mutex> lock(mu_);
  return {capacity_ - std::min(capacity_, total_reserved_ + hooks_->external_bytes(device_)), capacity_};
}

void DeviceAllocator::set_config(const AllocatorConfig& cfg) {
  std::lock_guard<std::mutex> lock(mu_);
  cfg_ = cfg;
  stats_.max_split_size = static_cast<int64_t>(std::min<size_t>(cfg_.max_split_size, INT64_MAX));
}

void DeviceAllocator::set_caching(bool enabled) {
  std::unique_lock<std::mutex> lock(mu_);
  // Without caching a freed block leaves at once (free_block), so kernels still queued on blocks freed into the
  // pools must have run first.
  if (!enabled && caching_) wait_for_streams(lock);
  caching_ = enabled;
}

void DeviceAllocator::attach_oom_observer(OomObserver obs) {
  std::lock_guard<std::mutex> lock(mu_);
  oom_observers_.push_back(std::move(obs));
}

std::vector<Block*> DeviceAllocator::all_blocks() const {
  std::vector<Block*> out(active_blocks_.begin(), active_blocks_.end());
  std::vector<const BlockPool*> pools{&large_, &small_};
  for (const auto& [id, pp] : private_pools_) {
    pools.push_back(&pp->large);
    pools.push_back(&pp->small);
  }
  for (const BlockPool* pool : pools) {
    out.insert(out.end(), pool->blocks.begin(), pool->blocks.end());
    out.insert(out.end(), pool->unmapped.begin(), pool->unmapped.end());
  }
  return out;
}

namespace {
BlockInfo describe(const Block* b) {
  BlockState st = b->allocated ? BlockState::kActiveAllocated
                  : b->event_count > 0 ? BlockState::kActivePendingFree
                                       : BlockState::kInactive;
  return {reinterpret_cast<uintptr_t>(b->ptr), b->size, st == BlockState::kInactive ? 0 : b->requested_size,
          st, b->context};
}

void add_block(SegmentInfo* seg, const Block* b) {
  BlockInfo info = describe(b);
  seg->total_size += b->size;
  if (info.state == BlockState::kActiveAllocated) {
    seg->allocated_size += b->size;
    seg->requested_size += b->requested_size;
  }
  if (info.state != BlockState::kInactive) seg->active_size += b->size;
  seg->blocks.push_back(std::move(info));
}
}  // namespace

std::vector<SegmentInfo> DeviceAllocator::snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  record_trace(Action::kSnapshot, 0, 0, 0, Context());
  std::vector<Block*> heads;
  for (Block* b : all_blocks())
    if (!b->prev) heads.push_back(b);
  std::sort(heads.begin(), heads.end(), [](Block* a, Block* b) { return a->ptr < b->ptr; });
  std::vector<SegmentInfo> out;
  for (Block* head : heads) {
    // A fixed segment is one chain; an expandable one reports each committed run as a segment.
    SegmentInfo* cur = nullptr;
    for (Block* b = head; b; b = b->next) {
      if (!b->mapped) {
        cur = nullptr;
        continue;
      }
      if (!cur) {
        out.push_back(SegmentInfo{device_, reinterpret_cast<uintptr_t>(b->ptr), 0, 0, 0, 0, b->stream,
                                  !b->pool->is_small, b->expandable != nullptr, {},
                                  b->pool->owner ? b->pool->owner->id : PoolId{0, 0}});
        cur = &out.back();
      }
      add_block(cur, b);
    }
  }
  return out;
}

std::vector<TraceEntry> DeviceAllocator::trace() {
  std::lock_guard<std::mutex> lock(mu_);
  // Oldest first: the ring buffer wraps at trace_next_.
  std::vector<TraceEntry> out(trace_.begin() + static_cast<std::ptrdiff_t>(trace_next_), trace_.end());
  out.insert(out.end(), trace_.begin(), trace_.begin() + static_cast<std::ptrdiff_t>(trace_next_));
  return out;
}

void DeviceAllocator::record_history(const HistoryOptions& opts, bool clear) {
  std::lock_guard<std::mutex> lock(mu_);
  history_ = opts;
  skip_.assign(static_cast<size_t>(Action::kOom) + 1, false);
  for (Action a : opts.skip) skip_[static_cast<size_t>(a)] = true;
  if (clear || !opts.record_trace) {
    trace_.clear();
    trace_next_ = 0;
  }
  if (!opts.record_state)
    for (Block* b : active_blocks_) b->context.reset();
}

void DeviceAllocator::record_trace(Action a, uintptr_t addr, size_t size, int64_t stream,
                                   const Context& ctx, size_t device_free) {
  if (!history_.record_trace || skip_[static_cast<size_t>(a)] || history_.max_entries == 0) return;
  int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  TraceEntry e{a, addr, size, stream, history_.context_on_trace ? ctx : Context(), now, device_free};
  if (trace_.size() < history_.max_entries) {
    trace_.push_back(std::move(e));
  } else {
    trace_[trace_next_] = std::move(e);
    trace_next_ = (trace_next_ + 1) % history_.max_entries;
  }
}

}  // namespace npudist::alloc
