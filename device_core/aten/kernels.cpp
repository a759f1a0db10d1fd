// Explicit npu kernels: only where semantics need more than "run the CPU kernel on the same bytes" —
// allocation (bytes must come from the npu allocator on the right device), metadata-only views,
// resize/set_ (storage ownership), copies between devices, scalar reads and record_stream.
#include <ATen/EmptyTensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/tensor_split_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include "allocator/npu_allocator.h"
#include "graph/graph_capture.h"
#include "npu_tensor.h"
#include "profiler/profiler.h"

namespace npudist {

int resolve_device_index(std::optional<c10::Device> device) {
  int idx = (device && device->has_index()) ? device->index() : rt::current_device();
  int n = rt::device_count();
  TORCH_CHECK_VALUE(idx >= 0 && idx < n, "Invalid npu device index ", idx, ": this process sees ", n,
                    " npu device(s) (set by NPUDIST_DEVICE_COUNT and ASCEND_RT_VISIBLE_DEVICES)");
  rt::api().mark_initialized();  // every npu tensor is born here: the runtime is in use (is_initialized)
  return idx;
}

namespace {

const c10::DispatchKeySet kNpuKeys(c10::DispatchKey::PrivateUse1);

void check_factory_args(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK_VALUE(layout.value_or(c10::kStrided) == c10::kStrided,
                    "npu tensors support only the strided layout, got ", *layout);
  TORCH_CHECK_VALUE(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned (pin_memory=True on npu)");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_factory_args(layout, pin_memory);
  DeviceScope ds(resolve_device_index(device));
  return at::detail::empty_generic(size, memory::allocator(), kNpuKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_factory_args(layout, pin_memory);
  DeviceScope ds(resolve_device_index(device));
  return at::detail::empty_strided_generic(size, stride, memory::allocator(), kNpuKeys,
                                           c10::dtype_or_default(dtype));
}

}  // namespace

// Grow the storage (never shrink, like CPU/CUDA) so that the tensor's current geometry fits.
static void ensure_storage_fits(const at::Tensor& self) {
  size_t need = at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(),
                                                 self.storage_offset());
  c10::StorageImpl* s = self.storage().unsafeGetStorageImpl();
  if (need > s->nbytes()) resize_npu_storage(s, need);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  for (int64_t d : size) TORCH_CHECK_VALUE(d >= 0, "resize_: negative dimension in size ", size);
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) impl->set_sizes_contiguous(size);
  if (memory_format) {
    TORCH_CHECK_VALUE(*memory_format != c10::MemoryFormat::Preserve, "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  ensure_storage_fits(self);
  return self;
}

namespace {

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kNpu, "Attempted to set the storage of an npu tensor to a storage on ",
              source.device(), ". This is no longer allowed; the devices must match.");
  TORCH_CHECK_VALUE(storage_offset >= 0, "Tensor: invalid storage offset ", storage_offset);
  auto* impl = self.unsafeGetTensorImpl();
  if (!self.storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(storage_offset);
  if (stride.empty()) impl->set_sizes_contiguous(size);
  else impl->set_sizes_and_strides(size, stride);
  ensure_storage_fits(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.unsafeGetTensorImpl() == src.unsafeGetTensorImpl()) return self;
  TORCH_CHECK(self.dtype() == src.dtype(), "Could not set tensor of type ", src.dtype(), " to a tensor of type ",
              self.dtype());
  return set_storage_offset(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  DeviceScope ds(self.device().index());
  c10::Storage fresh(c10::Storage::use_byte_size_t(), 0, memory::allocator(), /*resizable=*/true);
  return set_storage_offset(self, std::move(fresh), 0, {0}, {});
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK_VALUE(stream.device_type() == kNpu, "record_stream: expected an npu stream, got one on ",
                    stream.device());
  memory::record_stream(self.storage().data_ptr(), stream);
}

// Autograd returns _efficientzerotensor for gradients known to be zero (e.g. sgn of a real input). Its
// CPU kernel builds a CPU ZeroTensor (no bytes); adopted by the fallback it would lose the ZeroTensor key
// and become an npu tensor over a null pointer. Build an npu ZeroTensor, as CUDA does.
at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory) {
  check_factory_args(layout, pin_memory);
  at::native::ZeroTensorAllocator zeros(npu_device(resolve_device_index(device)));
  return at::detail::empty_generic(size, &zeros, kNpuKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor),
                                   c10::dtype_or_default(dtype), std::nullopt);
}

// native_dropout has no generator argument: its CPU kernel would draw from the CPU generator. Build it
// from bernoulli_ on npu (which draws from the npu generator), with the CPU kernel's semantics.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  double p1m = 1. - p;
  double scale = p1m == 0 ? 0. : 1. / p1m;
  at::Tensor mask = at::empty_like(input, at::MemoryFormat::Contiguous);  // input's dtype, as on CPU
  mask.bernoulli_(p1m);
  return {input.mul(mask).mul_(scale), mask};
}

// scaled_dot_product_attention picks its backend through _fused_sdp_choice_stub, which falls back to
// the math decomposition for devices without an entry. Make npu choose exactly what CPU chooses (e.g.
// the CPU flash kernel), so attention on npu is bitwise identical to CPU.
int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  // Under torch.compile the Meta kernel of _fused_sdp_choice calls this stub with fake npu tensors (no data
  // to alias): answer what it answers for fake CPU tensors, the math decomposition, which Inductor fuses.
  constexpr auto kTracing = c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize});
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->key_set().has_any(kTracing)) return static_cast<int64_t>(sdp::SDPBackend::math);
  }
  // CPU's choice reads only metadata of the aliases (sizes, strides, dtypes), never their bytes. It depends
  // on requires_grad (e.g. a mask that requires grad rules out the flash kernel, which has no gradient for
  // it), so the aliases carry it over.
  auto cpu = [](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNpu) return t;
    at::Tensor alias = cpu_alias(t);
    if (t.requires_grad()) alias.set_requires_grad(true);
    return alias;
  };
  std::optional<at::Tensor> m;
  if (mask.has_value() && mask->defined()) m = cpu(*mask);
  return at::_fused_sdp_choice(cpu(q), cpu(k), cpu(v), m, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace npudist

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &npudist::fused_sdp_choice)
}  // namespace at::native

namespace npudist {
namespace {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(native_dropout));
  m.impl("_efficientzerotensor", TORCH_FN(efficientzerotensor));
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("record_stream", TORCH_FN(record_stream));
}

// tensor_split(self, Tensor indices_or_sections) reads the indices on the host and insists they are a
// CPU tensor (CUDA raises too). On npu the indices are host-readable device memory: accept them by
// moving them to CPU before the composite kernel (registered for autograd, where that kernel runs).
std::vector<at::Tensor> tensor_split_indices(const at::Tensor& self, const at::Tensor& indices, int64_t dim) {
  return at::native::tensor_split(self, indices.device().type() == kNpu ? indices.cpu() : indices, dim);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("tensor_split.tensor_indices_or_sections", TORCH_FN(tensor_split_indices));
}

// copy_ handles conjugate/negative bits itself (the CPU copy kernel conjugates/negates while copying),
// but for npu it first redispatches to _copy_from, which PyTorch's Conjugate/Negative fallbacks do not
// pass through: they would materialise the source with clone(), whose copy_ calls _copy_from again --
// unbounded recursion (SIGSEGV). Pass the bits through to copy_from, whose CPU aliases carry them.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace
}  // namespace npudist
