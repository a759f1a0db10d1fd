// The primitives npu_tensor.h declares for every room: npu bytes seen as CPU tensors (cpu_alias and its
// storages), tensors over a given storage, and CPU-kernel outputs adopted as npu memory. They sit below
// the rooms (op_path, graph and aten call them) and depend only on the allocator's interface.
//
// Why a CPU-allocator wrapper (and not a copy): new outputs of a CPU kernel are allocated through the
// CPU allocator. During the fallback a thread-local scope makes the CPU allocator (which we wrap, and
// which delegates to the original otherwise) allocate from the npu allocator, so every output byte is
// owned and counted by the npu allocator from birth and adoption is a re-tag, not a copy. The flag is
// thread-local, so CPU work on other threads is unaffected; temporaries of the kernel are counted too
// (as device workspace would be). Outputs allocated elsewhere (e.g. on an intra-op worker thread) are
// detected and copied, so the accounting invariant always holds.
#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "allocator/npu_allocator.h"
#include "npu_tensor.h"

namespace npudist {
namespace {

// ------------------------------------------------------------------------------------------------
// CPU allocator wrapper
// ------------------------------------------------------------------------------------------------
thread_local int tls_adopt_device = -1;
thread_local std::vector<const void*> tls_adopted;

// HOST-MEMORY: CPU kernels write outputs into npu memory; a real device runs device kernels instead.
class AdoptingCpuAllocator final : public c10::Allocator {
 public:
  explicit AdoptingCpuAllocator(c10::Allocator* base) : base_(base) { g_base_raw_deleter = base->raw_deleter(); }
  c10::DataPtr allocate(size_t n) override {
    if (tls_adopt_device < 0) return base_->allocate(n);
    c10::DataPtr p = memory::allocator()->allocate(n);
    p.unsafe_set_device(c10::Device(c10::kCPU));
    tls_adopted.push_back(p.get());
    return p;
  }
  // raw_allocate (used e.g. by oneDNN/ideep for scratch buffers) frees through raw_deleter(): memory
  // handed out inside an AdoptScope belongs to the npu allocator and must go back there.
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  static void raw_delete(void* ptr) {
    if (memory::owns(ptr)) memory::allocator()->raw_deleter()(ptr);
    else g_base_raw_deleter(ptr);
  }
  static inline c10::DeleterFnPtr g_base_raw_deleter = nullptr;
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  c10::Allocator* base_;
};

AdoptingCpuAllocator* g_cpu_wrapper = nullptr;

void decref_storage(void* ctx) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx)); }

}  // namespace

void install_cpu_allocator_wrapper() {
  if (g_cpu_wrapper) return;
  g_cpu_wrapper = new AdoptingCpuAllocator(c10::GetAllocator(c10::kCPU));
  c10::SetAllocator(c10::kCPU, g_cpu_wrapper, /*priority=*/100);
}

AdoptScope::AdoptScope(int device) : prev_device_(tls_adopt_device), prev_size_(tls_adopted.size()) {
  tls_adopt_device = device;
}
AdoptScope::~AdoptScope() {
  tls_adopt_device = prev_device_;
  tls_adopted.resize(prev_size_);
}
bool AdoptScope::owns(const void* ptr) const {
  return std::find(tls_adopted.begin() + prev_size_, tls_adopted.end(), ptr) != tls_adopted.end();
}

// ------------------------------------------------------------------------------------------------
// Aliases and adoption
// ------------------------------------------------------------------------------------------------
// HOST-MEMORY: a CPU storage over the npu bytes; a real device copies to host (aclrtMemcpy D2H) or runs a device kernel.
c10::Storage cpu_storage_alias(c10::StorageImpl* si) {
  c10::raw::intrusive_ptr::incref(si);
  c10::DataPtr dp(si->mutable_data_ptr().get(), si, &decref_storage, c10::Device(c10::kCPU));
  // Resizable through the wrapper: an out= kernel that resizes its output allocates npu memory, which
  // the fallback then moves into the npu storage.
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), si->nbytes(),
                                                            std::move(dp), g_cpu_wrapper, /*resizable=*/true));
}

// HOST-MEMORY: as cpu_storage_alias, without a reference to the npu storage.
c10::Storage cpu_storage_view(void* data, size_t nbytes) {
  c10::DataPtr dp(data, c10::Device(c10::kCPU));  // no context, no deleter: the bytes are not its to free
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(dp), g_cpu_wrapper, /*resizable=*/true));
}

c10::Storage queued_storage_alias(c10::StorageImpl* si, int64_t stream) {
  if (memory::order_reuse_after(si->data_ptr(), stream)) {
    return cpu_storage_view(si->mutable_data_ptr().get(), si->nbytes());
  }
  return cpu_storage_alias(si);
}

at::Tensor queued_cpu_alias(const at::Tensor& t, int64_t stream) {
  c10::Storage storage = queued_storage_alias(t.storage().unsafeGetStorageImpl(), stream);
  return cpu_alias(t, &storage);
}

at::Tensor tensor_over(c10::Storage storage, c10::DispatchKey key, const at::Tensor& g) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), g.dtype());
  impl->set_sizes_and_strides(g.sizes(), g.strides(), g.storage_offset());
  if (g.is_conj()) impl->_set_conj(true);
  if (g.is_neg()) impl->_set_neg(true);
  return at::Tensor(std::move(impl));
}

at::Tensor cpu_alias(const at::Tensor& t, const c10::Storage* storage_alias) {
  c10::Storage storage = storage_alias ? *storage_alias : cpu_storage_alias(t.storage().unsafeGetStorageImpl());
  return tensor_over(std::move(storage), c10::DispatchKey::CPU, t);
}

at::Tensor make_npu_tensor(c10::Storage storage, const at::Tensor& g) {
  return tensor_over(std::move(storage), c10::DispatchKey::PrivateUse1, g);
}

c10::Storage adopt_storage(const c10::Storage& cpu, int device, const AdoptScope& scope) {
  c10::StorageImpl* si = cpu.unsafeGetStorageImpl();
  if (si->device().type() == kNpu) return cpu;  // already adopted through another output
  if (si->data_ptr().get() == nullptr || scope.owns(si->data_ptr().get())) {
    si->mutable_data_ptr().unsafe_set_device(npu_device(device));
    si->set_allocator(memory::allocator());
    return cpu;
  }
  DeviceScope ds(device);
  c10::DataPtr fresh = memory::allocator()->allocate(si->nbytes());
  if (si->nbytes()) {
    rt::check(rt::api().memcpy(fresh.get(), si->data(), si->nbytes(), NPUDIST_MEMCPY_HOST_TO_DEVICE));
  }
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), si->nbytes(),
                                                            std::move(fresh), memory::allocator(), true));
}

}  // namespace npudist
