// Interim host allocator: every npu byte is malloc'ed here and counted per device.
// Replaced by the caching allocator (issue 3) behind the same npu_allocator.h interface.
#include "npu_allocator.h"

#include <atomic>
#include <cstdlib>
#include <torch/extension.h>

#include "npudist/runtime.h"

namespace npudist::memory {
namespace {

constexpr int kMaxDevices = 64;
std::atomic<int64_t> g_allocated[kMaxDevices];

struct Ctx {
  int device;
  size_t size;
};

void free_block(void* p) {
  auto* c = static_cast<Ctx*>(p);
  g_allocated[c->device] -= static_cast<int64_t>(c->size);
  std::free(c);  // the ctx is the start of the malloc block, see allocate()
}

class SimpleNpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    int dev = runtime::current_device();
    c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev));
    size_t cap = runtime::device_capacity(dev);
    if (g_allocated[dev] + static_cast<int64_t>(n) > static_cast<int64_t>(cap)) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory. Tried to allocate ", n,
                       " bytes on npu:", dev, " (capacity ", cap, " bytes, ", g_allocated[dev].load(),
                       " bytes already allocated)");
    }
    // One malloc: [Ctx padded to 64 bytes][data]; 64-byte aligned data for vectorised kernels.
    void* raw = nullptr;
    if (posix_memalign(&raw, 64, 64 + (n ? n : 1)) != 0) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "host allocation of ", n, " bytes failed");
    }
    auto* ctx = new (raw) Ctx{dev, n};
    g_allocated[dev] += static_cast<int64_t>(n);
    return {static_cast<char*>(raw) + 64, ctx, &free_block, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

SimpleNpuAllocator g_alloc;

}  // namespace

c10::Allocator* allocator() { return &g_alloc; }

void record_stream(const c10::DataPtr&, c10::Stream) {}

void init_bindings(pybind11::module_& m) {
  m.def("_memory_allocated", [](int dev) { return g_allocated[dev].load(); });
}

}  // namespace npudist::memory
