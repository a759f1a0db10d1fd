// Helpers shared by the npu kernels, the zero-copy fallback and the hooks (ATen-level, device_core-internal).
// Each declaration names the file that defines it.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/GeneratorImpl.h>

#include <mutex>

#include "npu_runtime.h"

namespace npudist {

constexpr auto kNpu = c10::DeviceType::PrivateUse1;

inline c10::Device npu_device(int index) { return c10::Device(kNpu, static_cast<c10::DeviceIndex>(index)); }

// Makes `index` the calling thread's current npu device for a scope (what the allocator allocates on).
class DeviceScope {
 public:
  explicit DeviceScope(int index) : prev_(rt::current_device()) {
    if (index >= 0 && index != prev_) rt::set_device(index);
  }
  ~DeviceScope() {
    if (rt::current_device() != prev_) rt::set_device(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_;
};

// Index of an npu device argument, or the current device when the index is absent. Validated (aten/kernels.cpp).
int resolve_device_index(std::optional<c10::Device> device);

// ---- CPU aliases and adoption (npu_tensor.cpp): primitives below every room, which depend only on the
// allocator's interface.
// A CPU tensor over exactly the bytes of npu tensor `t` (same sizes, strides, offset, dtype, conj/neg
// bits). Its storage keeps t's storage alive. When `storage_alias` is given, reuse it (several arguments
// on one npu storage must share one CPU storage, or storage-identity checks in CPU kernels break).
at::Tensor cpu_alias(const at::Tensor& t, const c10::Storage* storage_alias = nullptr);
// The CPU storage that cpu_alias would build for `npu_storage`.
c10::Storage cpu_storage_alias(c10::StorageImpl* npu_storage);
// A CPU storage over `nbytes` at `data` that holds nothing: whoever uses it keeps the bytes alive otherwise.
c10::Storage cpu_storage_view(void* data, size_t nbytes);
// What a kernel queued on `stream` sees of an npu storage / tensor: a view that does not hold the bytes when the
// caching allocator reuses them in that stream's order (memory::order_reuse_after), else an alias that holds them
// until the kernel is destroyed. Why: a tensor the host drops while its kernels are queued then returns its
// block to the stream's pool at once, so queued kernels hold no memory (docs/memory.md, "Stream-ordered reuse").
c10::Storage queued_storage_alias(c10::StorageImpl* npu_storage, int64_t stream);
at::Tensor queued_cpu_alias(const at::Tensor& t, int64_t stream);

// A tensor of dispatch key `key` over `storage` with the geometry (sizes, strides, offset, dtype, conj/neg
// bits) of `geometry_like`.
at::Tensor tensor_over(c10::Storage storage, c10::DispatchKey key, const at::Tensor& geometry_like);
// An npu tensor over `storage` (which must already be an npu storage) with the given geometry.
at::Tensor make_npu_tensor(c10::Storage storage, const at::Tensor& geometry_like);

// Storage resize on npu (hooks.cpp): new bytes from the npu allocator, old content kept up to min(old, new).
void resize_npu_storage(c10::StorageImpl* storage, size_t nbytes);
// aten::resize_ on an npu tensor (aten/kernels.cpp): sizes set, storage grown through resize_npu_storage.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> memory_format);

// Adopting CPU-kernel outputs (npu_tensor.cpp, for op_path/fallback.cpp): while an AdoptScope is active on a
// thread, the CPU allocator hands out npu-allocator memory (tagged CPU) so that outputs can be re-tagged as npu.
class AdoptScope {
 public:
  explicit AdoptScope(int device);
  ~AdoptScope();
  AdoptScope(const AdoptScope&) = delete;
  AdoptScope& operator=(const AdoptScope&) = delete;
  // True if `ptr` was handed out by the npu allocator within this scope.
  bool owns(const void* ptr) const;

 private:
  int prev_device_;
  size_t prev_size_;
};
// Wraps c10's CPU allocator so that AdoptScope can redirect it (npu_tensor.cpp; module.cpp calls it at import).
void install_cpu_allocator_wrapper();
// Route ops that have a CPU kernel and a composite decomposition to the CPU kernel (op_path/op_redirects.cpp).
size_t register_cpu_kernel_redirects();

// Convert a storage produced by a CPU kernel into an npu storage on `device` (npu_tensor.cpp): re-tag it if its
// bytes came from the npu allocator within `scope`, otherwise copy into fresh npu memory.
c10::Storage adopt_storage(const c10::Storage& cpu_storage, int device, const AdoptScope& scope);

// RNG (hooks.cpp): per-device npu generators; a random CPU kernel runs with a CPU generator seeded
// from the npu generator's (seed, offset), after which the offset advances.
c10::GeneratorImpl* npu_generator_for(const std::optional<at::Generator>& gen, int device);
std::mutex& npu_generator_mutex(c10::GeneratorImpl* gen);
at::Generator begin_random_op(c10::GeneratorImpl* gen);  // caller holds the generator mutex
// A new CPU generator in the state begin_random_op would give the shared one: for a queued kernel, which
// runs after later ops have reseeded the shared one. Caller holds the generator mutex.
at::Generator fork_random_op(c10::GeneratorImpl* gen);
void end_random_op(c10::GeneratorImpl* gen, uint64_t numel);
const at::Generator& default_npu_generator(int device);
at::Generator new_npu_generator(int device);

}  // namespace npudist
