// Front of the caching allocator: routes pointers to their device and validates arguments.
#include "caching_allocator.h"

#include <cstring>

#include "device_allocator.h"

namespace npudist::alloc {

namespace {
const char* const kActionNames[] = {"alloc",         "free_requested", "free_completed",
                                    "segment_alloc", "segment_free",   "segment_map",
                                    "segment_unmap", "snapshot",       "oom"};
}  // namespace

const char* action_name(Action a) { return kActionNames[static_cast<size_t>(a)]; }

bool parse_action(const std::string& s, Action* out) {
  for (size_t i = 0; i <= static_cast<size_t>(Action::kOom); ++i) {
    if (s == kActionNames[i]) {
      *out = static_cast<Action>(i);
      return true;
    }
  }
  return false;
}

CachingAllocator::CachingAllocator(std::shared_ptr<DeviceHooks> hooks, AllocatorConfig cfg,
                                   bool caching_enabled)
    : hooks_(std::move(hooks)), caching_(caching_enabled), cfg_(std::move(cfg)) {
  int n = hooks_->device_count();
  for (int d = 0; d < n; ++d)
    devices_.push_back(std::make_unique<DeviceAllocator>(d, hooks_.get(), cfg_, caching_));
}

CachingAllocator::~CachingAllocator() = default;

DeviceAllocator& CachingAllocator::dev(int device) {
  if (device < 0 || device >= static_cast<int>(devices_.size()))
    throw std::invalid_argument("invalid npu device index " + std::to_string(device) + " (there are " +
                                std::to_string(devices_.size()) + " visible npu devices)");
  return *devices_[device];
}

void* CachingAllocator::malloc(int device, size_t size, int64_t stream, const Context& ctx) {
  DeviceAllocator& d = dev(device);
  if (size == 0) return nullptr;
  Block* b = d.malloc(size, stream, ctx);
  std::lock_guard<std::mutex> lock(map_mu_);
  live_.emplace(b->ptr, b);
  return b->ptr;
}

void CachingAllocator::free(void* ptr, const Context& ctx) {
  if (!ptr) return;
  Block* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(map_mu_);
    auto it = live_.find(ptr);
    if (it == live_.end())
      throw std::invalid_argument("pointer was not allocated by the npu caching allocator (or was freed twice)");
    b = it->second;
    live_.erase(it);
  }
  devices_[b->device]->free(b, ctx);
}

Block* CachingAllocator::live_block(void* ptr, const char* what) {
  std::lock_guard<std::mutex> lock(map_mu_);
  auto it = live_.find(ptr);
  if (it == live_.end())
    throw std::invalid_argument(std::string(what) + ": pointer was not allocated by the npu caching allocator");
  return it->second;
}

void CachingAllocator::record_stream(void* ptr, int64_t stream) {
  if (!ptr) return;
  Block* b = live_block(ptr, "record_stream");
  devices_[b->device]->record_stream(b, stream);
}

void CachingAllocator::erase_stream(void* ptr, int64_t stream) {
  if (!ptr) return;
  Block* b = live_block(ptr, "erase_stream");
  devices_[b->device]->erase_stream(b, stream);
}

bool CachingAllocator::owns(void* ptr) {
  std::lock_guard<std::mutex> lock(map_mu_);
  return live_.count(ptr) > 0;
}

int64_t CachingAllocator::stream_of(void* ptr) {
  std::lock_guard<std::mutex> lock(map_mu_);
  auto it = live_.find(ptr);
  return it == live_.end() ? -1 : it->second->stream;  // a live block's stream never changes
}

void CachingAllocator::empty_cache() {
  for (auto& d : devices_) d->empty_cache();
}

void CachingAllocator::empty_cache(PoolId pool) {
  for (auto& d : devices_) d->empty_cache(pool);
}

void CachingAllocator::create_pool(int device, PoolId pool, const PoolOptions& opts) {
  dev(device).create_pool(pool, opts);
}

void CachingAllocator::begin_allocate_to_pool(int device, PoolId pool, PoolFilter filter) {
  if (!filter) throw std::invalid_argument("begin_allocate_to_pool: no filter given");
  dev(device).begin_allocate_to_pool(pool, std::move(filter));
}

void CachingAllocator::end_allocate_to_pool(int device, PoolId pool) { dev(device).end_allocate_to_pool(pool); }
void CachingAllocator::release_pool(int device, PoolId pool) { dev(device).release_pool(pool); }
int CachingAllocator::pool_use_count(int device, PoolId pool) { return dev(device).pool_use_count(pool); }

DeviceStats CachingAllocator::stats(int device) { return dev(device).stats(); }
void CachingAllocator::reset_peak_stats(int device) { dev(device).reset_peak_stats(); }
void CachingAllocator::reset_accumulated_stats(int device) { dev(device).reset_accumulated_stats(); }

void CachingAllocator::set_memory_fraction(double fraction, int device) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw std::invalid_argument("invalid memory fraction " + std::to_string(fraction) +
                                ": give a value between 0.0 and 1.0");
  dev(device).set_memory_fraction(fraction);
}

double CachingAllocator::memory_fraction(int device) { return dev(device).memory_fraction(); }
std::pair<size_t, size_t> CachingAllocator::mem_info(int device) { return dev(device).mem_info(); }

std::vector<SegmentInfo> CachingAllocator::snapshot() {
  std::vector<SegmentInfo> out;
  for (auto& d : devices_) {
    auto s = d->snapshot();
    out.insert(out.end(), std::make_move_iterator(s.begin()), std::make_move_iterator(s.end()));
  }
  return out;
}

std::vector<std::vector<TraceEntry>> CachingAllocator::traces() {
  std::vector<std::vector<TraceEntry>> out;
  for (auto& d : devices_) out.push_back(d->trace());
  return out;
}

void CachingAllocator::record_history(const HistoryOptions& opts, bool clear) {
  {
    std::lock_guard<std::mutex> lock(cfg_mu_);
    history_ = opts;
  }
  for (auto& d : devices_) d->record_history(opts, clear);
}

HistoryOptions CachingAllocator::history() {
  std::lock_guard<std::mutex> lock(cfg_mu_);
  return history_;
}

void CachingAllocator::attach_oom_observer(OomObserver obs) {
  for (auto& d : devices_) d->attach_oom_observer(obs);
}

void CachingAllocator::set_config(const AllocatorConfig& cfg) {
  {
    std::lock_guard<std::mutex> lock(cfg_mu_);
    cfg_ = cfg;
  }
  for (auto& d : devices_) d->set_config(cfg);
}

void CachingAllocator::set_caching(bool enabled) {
  caching_.store(enabled);
  for (auto& d : devices_) d->set_caching(enabled);
}

void CachingAllocator::lock_all() {
  cfg_mu_.lock();
  for (auto& d : devices_) d->mutex().lock();
  map_mu_.lock();
}

void CachingAllocator::unlock_all() {
  map_mu_.unlock();
  for (auto it = devices_.rbegin(); it != devices_.rend(); ++it) (*it)->mutex().unlock();
  cfg_mu_.unlock();
}

AllocatorConfig CachingAllocator::config() {
  std::lock_guard<std::mutex> lock(cfg_mu_);
  return cfg_;
}

}  // namespace npudist::alloc
