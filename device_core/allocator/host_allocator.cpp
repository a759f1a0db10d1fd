// Pinned host memory: PyTorch's caching host allocator (ATen/core/CachingHostAllocator.h, the one CUDA and
// XPU specialise) over the npu runtime's streams and events. Freed blocks are cached by power-of-two size
// and handed out again only after every stream recorded on them (record_stream) has run past the free;
// stats, peaks and empty_cache are PyTorch's, so torch.npu.host_memory_stats() has torch.cuda's keys and
// meaning. Registered as PrivateUse1's host allocator (torch.accelerator.empty_host_cache() reaches it) and
// returned by the PrivateUse1 hooks' getPinnedMemoryAllocator (tensor.pin_memory(), pin_memory=True).
//
// Pinned memory is ordinary page-aligned host memory here (posix_memalign): the emulated device reads host
// memory directly, where a real runtime would page-lock it (aclrtMallocHost) for DMA. Its bytes never count
// against an npu device's capacity.
#include "allocator/host_allocator.h"

#include <ATen/core/CachingHostAllocator.h>
#include <torch/extension.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "npu_runtime.h"
#include "npu_tensor.h"

namespace npudist::host_memory {
namespace {

// Every host block's address range, for is_pinned (blocks are only created and destroyed through the hooks
// below, so this map is exact).
std::mutex g_ranges_mu;
std::map<uintptr_t, size_t> g_ranges;  // start -> size

// A runtime event owned by value (the allocator moves events between its queues).
struct HostEvent {
  std::shared_ptr<void> ev;
};

int64_t elapsed_us(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
}

struct NpuHostAllocatorImpl final : public at::CachingHostAllocatorImpl<c10::Stream, HostEvent> {
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  void allocate_host_memory(size_t size, void** ptr) override {
    auto start = std::chrono::steady_clock::now();
    void* p = nullptr;
    // Page alignment, as a page-locked allocation has.
    if (posix_memalign(&p, 4096, size) != 0 || p == nullptr) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "pinned host allocation of ", size, " bytes failed (out of host "
                       "memory); free pinned tensors or call torch.npu.host_empty_cache()");
    }
    {
      std::lock_guard<std::mutex> lk(g_ranges_mu);
      g_ranges[reinterpret_cast<uintptr_t>(p)] = size;
    }
    *ptr = p;
    std::lock_guard<std::mutex> g(stats_.timing_mutex_);
    stats_.host_alloc_time.increase(elapsed_us(start));
  }

  void free_block(at::HostBlock<c10::Stream>* block) override {
    auto start = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lk(g_ranges_mu);
      g_ranges.erase(reinterpret_cast<uintptr_t>(block->ptr_));
    }
    std::free(block->ptr_);
    std::lock_guard<std::mutex> g(stats_.timing_mutex_);
    stats_.host_free_time.increase(elapsed_us(start));
  }

  void record_stream(std::optional<std::vector<HostEvent>>& events, c10::Stream stream) override {
    NpudistEvent e = nullptr;
    rt::check(rt::api().event_create(&e));
    HostEvent ev{std::shared_ptr<void>(e, [](void* p) { rt::api().event_destroy(static_cast<NpudistEvent>(p)); })};
    rt::check(rt::api().event_record(e, stream.device_index(), stream.id()));
    events->push_back(std::move(ev));
  }

  bool query_event(HostEvent& event) override {
    return rt::api().event_query(static_cast<NpudistEvent>(event.ev.get())) != 0;
  }

  c10::Stream get_current_stream() const override {
    int dev = rt::current_device();
    return c10::Stream(c10::Stream::UNSAFE, npu_device(dev), rt::api().get_stream(dev));
  }

  // No private host pools are used (NPUGraph capture refuses host copies), so no stream is capturing here.
  bool stream_is_capturing(c10::Stream) const override { return false; }
};

void raw_free(void* ctx);

struct NpuHostAllocator final : public at::CachingHostAllocatorInterface<NpuHostAllocatorImpl, raw_free> {};

// Created on first use and never destroyed: pinned tensors may be freed after static destruction at exit.
NpuHostAllocator& host_allocator() {
  static auto* a = new NpuHostAllocator();
  return *a;
}

void raw_free(void* ctx) { host_allocator().free(ctx); }

}  // namespace

c10::Allocator* allocator() { return &host_allocator(); }

bool is_pinned(const void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lk(g_ranges_mu);
  auto it = g_ranges.upper_bound(p);
  if (it == g_ranges.begin()) return false;
  --it;
  return p < it->first + it->second;
}

bool record_stream(void* ptr, void* ctx, c10::Stream stream) {
  TORCH_CHECK_VALUE(stream.device_type() == c10::DeviceType::PrivateUse1, "expected an npu stream, got ", stream);
  return host_allocator().record_event(ptr, ctx, stream);
}

namespace {
namespace py = pybind11;

py::dict stat_dict(const c10::CachingAllocator::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict duration_dict(const c10::CachingAllocator::DurationStat& s) {
  py::dict d;
  d["total"] = s.total;
  d["max"] = s.max;
  d["min"] = s.min;
  d["count"] = s.count;
  d["avg"] = s.count == 0 ? 0 : s.total / s.count;
  return d;
}

// torch._C._cuda_hostMemoryStats's layout (torch.cuda.host_memory_stats_as_nested_dict).
py::dict host_memory_stats() {
  at::HostStats s = host_allocator().get_stats();
  py::dict r;
  r["num_host_alloc"] = s.num_host_alloc;
  r["num_host_free"] = s.num_host_free;
  r["allocations"] = stat_dict(s.allocations);
  r["allocated_bytes"] = stat_dict(s.allocated_bytes);
  r["active_requests"] = stat_dict(s.active_requests);
  r["active_bytes"] = stat_dict(s.active_bytes);
  r["host_alloc_time"] = duration_dict(s.host_alloc_time);
  r["host_free_time"] = duration_dict(s.host_free_time);
  return r;
}

}  // namespace

void init_bindings(pybind11::module_& m) {
  at::setHostAllocator(c10::DeviceType::PrivateUse1, &host_allocator());
  auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("_npu_hostMemoryStats", &host_memory_stats);
  m.def("_npu_resetAccumulatedHostMemoryStats", [] { host_allocator().reset_accumulated_stats(); });
  m.def("_npu_resetPeakHostMemoryStats", [] { host_allocator().reset_peak_stats(); });
  m.def("_npu_hostEmptyCache", [] { host_allocator().empty_cache(); }, nogil);
  m.def("_npu_hostRecordStream", [](const at::Tensor& t, int device, int64_t stream_id) {
    TORCH_CHECK_VALUE(t.device().is_cpu(), "expected a pinned CPU tensor, got a tensor on ", t.device());
    const c10::DataPtr& dp = t.storage().data_ptr();
    c10::Stream s(c10::Stream::UNSAFE, npu_device(device), stream_id);
    TORCH_CHECK_VALUE(dp.get_deleter() == &raw_free && record_stream(dp.get(), dp.get_context(), s),
                      "record_stream: the tensor's memory is not pinned npu host memory (allocate it with "
                      "pin_memory=True or tensor.pin_memory())");
  });
}

}  // namespace npudist::host_memory
