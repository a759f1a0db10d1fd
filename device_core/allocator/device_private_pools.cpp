// Private pools of one device (torch.npu.MemPool / use_mem_pool): each has its own small and large block
// pools, so its segments serve only the allocations routed to it, and it returns them to the device only
// once nobody uses it (use count 0) and they are free.
#include <cassert>
#include <string>

#include "device_allocator.h"

namespace npudist::alloc {

namespace {
std::string pool_name(PoolId id) {
  return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}
}  // namespace

BlockPool* DeviceAllocator::pool_for(size_t size, int64_t stream) {
  bool small = size <= kSmallSize;
  // The most recent routing wins, so a nested use_mem_pool allocates to the inner pool.
  for (auto it = allocating_to_.rbegin(); it != allocating_to_.rend(); ++it) {
    if (it->second(stream)) {
      PrivatePool* pp = private_pools_.at(it->first).get();
      return small ? &pp->small : &pp->large;
    }
  }
  return small ? &small_ : &large_;
}

bool DeviceAllocator::get_free_block_on_oom(AllocParams& p) {
  // MemPool(use_on_oom=True): a last resort before the OOM error, the pool's cached blocks may serve an
  // allocation that is not routed to it.
  if (p.pool->owner) return false;
  BlockPool* wanted = p.pool;
  for (auto& [id, pp] : private_pools_) {
    if (!pp->opts.use_on_oom) continue;
    p.pool = wanted->is_small ? &pp->small : &pp->large;
    if (get_free_block(p)) return true;
  }
  p.pool = wanted;
  return false;
}

void DeviceAllocator::create_or_incref_pool(PoolId pool, const PoolOptions& opts) {
  if (pool == PoolId{0, 0})
    throw std::invalid_argument("private pool id (0, 0) is the default pool's; use a MemPool's id");
  auto it = private_pools_.find(pool);
  if (it == private_pools_.end()) {
    private_pools_.emplace(pool, std::make_unique<PrivatePool>(pool, opts));
    return;
  }
  if (opts.source && it->second->opts.source != opts.source)
    throw std::invalid_argument("private pool " + pool_name(pool) + " already exists with another allocator");
  it->second->use_count += 1;
}

void DeviceAllocator::create_pool(PoolId pool, const PoolOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);
  create_or_incref_pool(pool, opts);
}

void DeviceAllocator::begin_allocate_to_pool(PoolId pool, PoolFilter filter) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& entry : allocating_to_) {
    if (entry.first == pool)
      throw std::invalid_argument("allocations on npu:" + std::to_string(device_) + " already go to pool " +
                                  pool_name(pool) + " (use_mem_pool of one pool cannot be nested on a device)");
  }
  create_or_incref_pool(pool, PoolOptions{});
  allocating_to_.emplace_back(pool, std::move(filter));
}

void DeviceAllocator::end_allocate_to_pool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = allocating_to_.begin(); it != allocating_to_.end(); ++it) {
    if (it->first == pool) {
      allocating_to_.erase(it);
      return;
    }
  }
  throw std::invalid_argument("allocations on npu:" + std::to_string(device_) + " do not go to pool " +
                              pool_name(pool));
}

void DeviceAllocator::release_pool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = private_pools_.find(pool);
  if (it == private_pools_.end() || it->second->use_count == 0)
    throw std::invalid_argument("npu:" + std::to_string(device_) + " has no pool " + pool_name(pool) +
                                " in use to release");
  it->second->use_count -= 1;
}

int DeviceAllocator::pool_use_count(PoolId pool) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = private_pools_.find(pool);
  return it == private_pools_.end() ? 0 : it->second->use_count;
}

void DeviceAllocator::release_private_pool_blocks(PrivatePool* pp, const Context& ctx) {
  release_blocks(&pp->large, ctx);
  release_blocks(&pp->small, ctx);
}

void DeviceAllocator::release_freeable_pools(const Context& ctx) {
  for (auto it = private_pools_.begin(); it != private_pools_.end();) {
    PrivatePool* pp = it->second.get();
    if (pp->use_count > 0) {
      ++it;
      continue;
    }
    release_private_pool_blocks(pp, ctx);
    // Forgotten once its last segment is back; live tensors keep it (and their segments) until freed.
    it = pp->segments == 0 ? private_pools_.erase(it) : std::next(it);
  }
}

void DeviceAllocator::empty_cache(PoolId pool) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = private_pools_.find(pool);
  if (it == private_pools_.end()) return;
  wait_pending(lock);
  wait_for_streams(lock);
  it = private_pools_.find(pool);  // the waits unlocked
  if (it == private_pools_.end()) return;
  release_private_pool_blocks(it->second.get(), Context());
  if (it->second->use_count == 0 && it->second->segments == 0) private_pools_.erase(it);
}

void* DeviceAllocator::map_segment_for(const AllocParams& p, size_t size) {
  PrivatePool* pp = p.pool->owner;
  if (!pp || !pp->opts.source) return hooks_->map_segment(device_, size);
  return pp->opts.source->alloc(device_, size, p.stream);
}

void DeviceAllocator::unmap_range(BlockPool* pool, void* ptr, size_t size, int64_t stream) {
  PrivatePool* pp = pool->owner;
  if (!pp || !pp->opts.source) {
    hooks_->unmap_segment(ptr, size);
  } else {
    pp->opts.source->free(ptr, size, device_, stream);
  }
}

}  // namespace npudist::alloc
