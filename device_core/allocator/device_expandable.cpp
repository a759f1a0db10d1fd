// Expandable segments: one address-space reservation per (stream, pool) that grows in place by
// committing 2 MiB pages behind its last free block, and gives pages back on empty_cache.
#include <algorithm>
#include <cassert>

#include "device_allocator.h"

namespace npudist::alloc {

ExpandableSegment* DeviceAllocator::expandable_for(int64_t stream, BlockPool* pool) {
  for (auto& seg : expandable_) {
    if (seg->stream == stream && seg->pool == pool) return seg.get();
  }
  // Reserve the whole device capacity: address space is cheap, so one segment can grow to the limit.
  auto seg = std::make_unique<ExpandableSegment>();
  size_t va = std::max(kExpandableGranularity, capacity_);
  seg->region = std::make_unique<ExpandableRegion>(hooks_, va, kExpandableGranularity);
  seg->stream = stream;
  seg->pool = pool;
  Block* all = new Block(device_, stream, seg->region->va_size(), pool, seg->region->base());
  all->mapped = false;
  all->expandable = seg.get();
  pool->unmapped.insert(all);
  expandable_.push_back(std::move(seg));
  return expandable_.back().get();
}

bool DeviceAllocator::alloc_expandable(AllocParams& p) {
  BlockPool* pool = p.pool;
  expandable_for(p.stream, pool);
  const size_t gran = kExpandableGranularity;
  // Pick the unmapped range that, together with the free mapped block just before it, needs the
  // fewest new pages; committing there extends that free block in place instead of fragmenting.
  Block* best = nullptr;
  size_t best_commit = SIZE_MAX;
  for (Block* u : pool->unmapped) {
    if (u->stream != p.stream) continue;
    size_t before = 0;
    if (u->prev && u->prev->mapped && !u->prev->allocated && u->prev->event_count == 0 &&
        u->prev->stream_uses.empty())
      before = u->prev->size;
    size_t need = p.size > before ? p.size - before : 0;
    size_t commit = (need + gran - 1) / gran * gran;
    if (commit == 0) commit = gran;
    if (commit <= u->size && commit < best_commit) {
      best = u;
      best_commit = commit;
    }
  }
  if (!best) return false;
  if (!segment_fits(best_commit)) return false;
  ExpandableSegment* seg = best->expandable;
  size_t offset = static_cast<size_t>(best->ptr - seg->region->base());
  if (!seg->region->commit(offset, best_commit)) return false;
  pool->unmapped.erase(best);
  if (best_commit < best->size) {
    Block* rest = new Block(device_, best->stream, best->size - best_commit, pool, best->ptr + best_commit);
    rest->mapped = false;
    rest->expandable = seg;
    rest->next = best->next;
    if (rest->next) rest->next->prev = rest;
    rest->prev = best;
    best->next = rest;
    best->size = best_commit;
    pool->unmapped.insert(rest);
  }
  best->mapped = true;
  if (seg->mapped_bytes == 0) {
    for (size_t t : stat_types(pool)) stats_.segment[t].increase(1);
  }
  seg->mapped_bytes += best_commit;
  total_reserved_ += best_commit;
  for (size_t t : stat_types(pool)) stats_.reserved_bytes[t].increase(static_cast<int64_t>(best_commit));
  stats_.num_device_alloc += 1;
  record_trace(Action::kSegmentMap, reinterpret_cast<uintptr_t>(best->ptr), best_commit, p.stream,
               *p.context);
  // Join the new pages with free mapped neighbours into one block for the request.
  try_merge_blocks(best, best->prev, pool);
  try_merge_blocks(best, best->next, pool);
  p.block = best;
  return true;
}

void DeviceAllocator::release_expandable_pages(Block* block, const Context& ctx) {
  ExpandableSegment* seg = block->expandable;
  const size_t gran = kExpandableGranularity;
  char* base = seg->region->base();
  size_t lo = static_cast<size_t>(block->ptr - base);
  size_t hi = lo + block->size;
  size_t start = (lo + gran - 1) / gran * gran, end = hi / gran * gran;
  if (end <= start) return;  // no whole page inside this free block
  BlockPool* pool = block->pool;
  pool->blocks.erase(block);
  // Split into [lo,start) mapped, [start,end) unmapped, [end,hi) mapped.
  if (start > lo) {
    Block* head = new Block(device_, block->stream, start - lo, pool, block->ptr);
    head->expandable = seg;
    head->prev = block->prev;
    if (head->prev) head->prev->next = head;
    head->next = block;
    block->prev = head;
    block->ptr += start - lo;
    block->size -= start - lo;
    cache_block(pool, head);
  }
  if (hi > end) {
    Block* tail = new Block(device_, block->stream, hi - end, pool, base + end);
    tail->expandable = seg;
    tail->next = block->next;
    if (tail->next) tail->next->prev = tail;
    tail->prev = block;
    block->next = tail;
    block->size -= hi - end;
    cache_block(pool, tail);
  }
  seg->region->decommit(start, end - start);
  block->mapped = false;
  size_t len = end - start;
  seg->mapped_bytes -= len;
  total_reserved_ -= len;
  for (size_t t : stat_types(pool)) {
    stats_.reserved_bytes[t].decrease(static_cast<int64_t>(len));
    if (seg->mapped_bytes == 0) stats_.segment[t].decrease(1);
  }
  stats_.num_device_free += 1;
  record_trace(Action::kSegmentUnmap, reinterpret_cast<uintptr_t>(block->ptr), len, block->stream, ctx);
  try_merge_blocks(block, block->prev, pool);
  try_merge_blocks(block, block->next, pool);
  pool->unmapped.insert(block);
}

}  // namespace npudist::alloc
