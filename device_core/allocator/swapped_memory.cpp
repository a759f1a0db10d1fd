// Swapped memory (torch_npu.empty_with_swapped_memory): npu tensors whose bytes are host memory outside the
// device budget, beside the caching allocator's adapter (npu_caching_allocator.cpp).
#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "npu_allocator_internal.h"
#include "npu_runtime.h"
#include "npu_tensor.h"

namespace npudist::memory {
namespace {

// npu tensors whose bytes are host memory outside
// the device budget. A swapped storage is recognised by its deleter (free_swapped): the caching allocator
// neither owns nor counts it, so memory_allocated and the capacity ignore it, and record_stream skips it.
// On Ascend the bytes are host memory mapped into the device's address space, as here; the npu kernels reach
// them like any npu bytes (which operators may run on them is decided in npudist/device/swapped_memory.py).
constexpr size_t kSwappedHeader = 4096;
std::atomic<int64_t> g_swapped_bytes{0};

void free_swapped(void* ctx) {
  auto* size = static_cast<size_t*>(ctx);
  g_swapped_bytes.fetch_sub(static_cast<int64_t>(*size));
  std::free(size);
}

class SwappedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    int dev = rt::current_device();
    // One allocation holds the size (for the counter) in front of page-aligned data.
    void* raw = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&raw, kSwappedHeader, kSwappedHeader + n) == 0 && raw,
                     "empty_with_swapped_memory: host allocation of ", n, " bytes failed (out of host memory)");
    *static_cast<size_t*>(raw) = n;
    g_swapped_bytes.fetch_add(static_cast<int64_t>(n));
    void* data = static_cast<char*>(raw) + kSwappedHeader;
    return {data, raw, &free_swapped, c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }  // data and context differ
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

SwappedAllocator g_swapped_allocator;

}  // namespace

namespace detail {

at::Tensor empty_with_swapped_memory(const std::vector<int64_t>& sizes, c10::ScalarType dtype, int device) {
  check_device(device);
  for (int64_t s : sizes) TORCH_CHECK_VALUE(s >= 0, "empty_with_swapped_memory: negative dimension ", s, " in ", sizes);
  DeviceScope scope(device);
  at::Tensor t = at::detail::empty_generic(sizes, &g_swapped_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           dtype, std::nullopt);
  // Its bytes must stay where they are: a resize would move them into the caching allocator.
  t.storage().unsafeGetStorageImpl()->set_resizable(false);
  return t;
}

bool is_swapped(const at::Tensor& t) {
  return t.has_storage() && t.storage().data_ptr().get_deleter() == &free_swapped;
}

int64_t swapped_bytes() { return g_swapped_bytes.load(); }

}  // namespace detail
}  // namespace npudist::memory
