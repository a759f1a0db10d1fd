// The zero-copy boxed fallback: every aten op without an explicit npu kernel runs its CPU kernel
// directly on the npu bytes.
//
// How: each npu argument is replaced by a CPU alias (a CPU tensor over the same bytes), the CPU kernel
// runs, and results are mapped back: a returned alias becomes the original npu tensor (in-place, out=),
// a result on an argument's storage becomes an npu view of that storage, a new result is adopted as npu.
//
// Why a CPU-allocator wrapper (and not a copy): new outputs of a CPU kernel are allocated through the
// CPU allocator. During the fallback a thread-local scope makes the CPU allocator (which we wrap, and
// which delegates to the original otherwise) allocate from the npu allocator, so every output byte is
// owned and counted by the npu allocator from birth and adoption is a re-tag, not a copy. The flag is
// thread-local, so CPU work on other threads is unaffected; temporaries of the kernel are counted too
// (as device workspace would be). Outputs allocated elsewhere (e.g. on an intra-op worker thread) are
// detected and copied, so the accounting invariant always holds.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <cstring>
#include <vector>

#include "allocator/npu_allocator.h"
#include "graph_capture.h"
#include "npu_tensor.h"
#include "profiler.h"

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

at::Tensor cpu_alias(const at::Tensor& t, const c10::Storage* storage_alias) {
  c10::Storage storage = storage_alias ? *storage_alias : cpu_storage_alias(t.storage().unsafeGetStorageImpl());
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) impl->_set_conj(true);
  if (t.is_neg()) impl->_set_neg(true);
  return at::Tensor(std::move(impl));
}

namespace {
at::Tensor as_cpu(const at::Tensor& t, const char* what) {
  if (t.device().type() == kNpu) return cpu_alias(t);
  TORCH_CHECK(t.device().is_cpu(), "copy between npu and ", t.device(), " is not supported (", what, ")");
  return t;
}
}  // namespace

// HOST-MEMORY: the CPU copy kernel reads/writes npu bytes; a real device uses aclrtMemcpyAsync (dense) or a copy kernel.
void copy_through_cpu(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  // Compute is host-synchronous, so non_blocking copies complete before returning.
  at::Tensor src_cpu = as_cpu(src, "source");
  at::Tensor dst_cpu = as_cpu(dst, "destination");
  dst_cpu.copy_(src_cpu, non_blocking);
}

// HOST-MEMORY: reads the element in place; a real device copies it to the host (aclrtMemcpy D2H) first.
c10::Scalar read_scalar(const at::Tensor& t) { return at::_local_scalar_dense(cpu_alias(t)); }

at::Tensor make_npu_tensor(c10::Storage storage, const at::Tensor& g) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                   g.dtype());
  impl->set_sizes_and_strides(g.sizes(), g.strides(), g.storage_offset());
  if (g.is_conj()) impl->_set_conj(true);
  if (g.is_neg()) impl->_set_neg(true);
  return at::Tensor(std::move(impl));
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

namespace {

// ------------------------------------------------------------------------------------------------
// The fallback
// ------------------------------------------------------------------------------------------------
struct Alias {
  at::Tensor orig;           // the npu argument
  at::Tensor cpu;            // its CPU alias passed to the kernel
  c10::StorageImpl* npu_si;  // orig's storage
  c10::Storage cpu_storage;  // alias storage (shared by all arguments on npu_si)
  void* orig_data;
};

// Ops whose CPU kernels legitimately take CPU tensors next to device tensors (as CUDA allows).
bool allows_cpu_tensors(const c10::OperatorName& name) {
  const std::string& n = name.name;
  return n == "aten::index" || n == "aten::index_put_" || n == "aten::_index_put_impl_" || n == "aten::index_put";
}

[[noreturn]] void fail_device_mismatch(const c10::OperatorHandle& op, const std::string& arg, c10::Device got,
                                       int device) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but got ", arg, " is on ", got,
              ", different from other tensors on ", npu_device(device), " (when checking argument in operator ",
              op.schema().operator_name(), ")");
}

bool is_optional_generator(const c10::Argument& a) {
  const auto& t = a.type();
  return t->kind() == c10::TypeKind::OptionalType &&
         t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

bool is_optional_tensor_list(const c10::Argument& a) {
  const auto& t = a.type();
  if (t->kind() != c10::TypeKind::ListType) return false;
  const auto& e = t->castRaw<c10::ListType>()->getElementType();
  return e->kind() == c10::TypeKind::OptionalType &&
         e->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
}

class Fallback {
 public:
  Fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) : op_(op), stack_(stack) {}

  void run() {
    const auto& args = op_.schema().arguments();
    const size_t nargs = args.size();
    const size_t begin = stack_->size() - nargs;
    for (size_t i = 0; i < nargs; ++i) scan(args[i], (*stack_)[begin + i]);
    TORCH_CHECK(device_ >= 0 || (pending_cpu_.empty() && !needs_generator_),
                "npu fallback: no npu argument in ", op_.schema().operator_name());
    if (device_ < 0) device_ = rt::current_device();
    if (!pending_cpu_.empty() && !allows_cpu_tensors(op_.schema().operator_name())) {
      fail_device_mismatch(op_, pending_cpu_.front().first, pending_cpu_.front().second, device_);
    }
    for (size_t i = 0; i < nargs; ++i) substitute(args[i], (*stack_)[begin + i]);

    DeviceScope ds(device_);
    AdoptScope adopt(device_);
    c10::GeneratorImpl* gen = needs_generator_ ? npu_generator_for(generator_, device_) : nullptr;
    // ---- NPUGraph capture hook (graph_capture.h): record this op if its stream is capturing ----
    graph::OpRecordingPtr recording;
    if (graph::any_capture_active()) {
      std::vector<c10::StorageImpl*> npu_storages;
      for (const Alias& a : aliases_) npu_storages.push_back(a.npu_si);
      recording = graph::begin_op(op_, device_, *stack_, nargs, !pending_cpu_.empty(),
                                  gen ? static_cast<int64_t>(generator_slot_) : -1, gen, npu_storages);
    }
    // ---- end of the capture hook ----
    std::unique_lock<std::mutex> gen_lock;
    if (gen) {
      gen_lock = std::unique_lock<std::mutex>(npu_generator_mutex(gen));
      (*stack_)[begin + generator_slot_] = c10::IValue(begin_random_op(gen));
    }
    { profiler::KernelScope kernel_event(op_, device_); call_cpu_kernel(); }
    sync_arguments(adopt);
    const size_t nret = op_.schema().returns().size();
    int64_t max_numel = max_numel_;
    for (size_t i = stack_->size() - nret; i < stack_->size(); ++i) map_result((*stack_)[i], adopt, max_numel);
    if (gen) end_random_op(gen, static_cast<uint64_t>(max_numel));
    if (recording) graph::end_op(std::move(recording), *stack_, nret, static_cast<uint64_t>(max_numel));  // NPUGraph
  }

 private:
  void note_tensor(const at::Tensor& t, const std::string& name) {
    if (!t.defined()) return;
    c10::Device d = t.device();
    if (d.type() == kNpu) {
      check_representable(t, "argument '" + name + "' is");
      if (device_ < 0) device_ = d.index();
      else if (d.index() != device_) fail_device_mismatch(op_, name, d, device_);
      max_numel_ = std::max<int64_t>(max_numel_, t.numel());
    } else if (d.type() == c10::kCPU) {
      if (t.dim() != 0) pending_cpu_.emplace_back(name, d);
    } else {
      pending_cpu_.emplace_back(name, d);
    }
  }

  void scan(const c10::Argument& a, const c10::IValue& v) {
    if (v.isTensor()) {
      note_tensor(v.toTensor(), a.name());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) note_tensor(t, a.name());
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) note_tensor(e.toTensor(), a.name());
      }
    } else if (v.isDevice()) {
      c10::Device d = v.toDevice();
      if (d.type() == kNpu) {
        int idx = resolve_device_index(d);
        if (device_ < 0) device_ = idx;
      }
    } else if (v.isGenerator() || (v.isNone() && is_optional_generator(a))) {
      generator_slot_ = &a - op_.schema().arguments().data();
      needs_generator_ = true;
      if (v.isGenerator()) generator_ = v.toGenerator();
    }
  }

  at::Tensor alias_of(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNpu) return t;
    c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
    const c10::Storage* shared = nullptr;
    for (const Alias& a : aliases_) {
      if (a.npu_si == si) {
        shared = &a.cpu_storage;
        break;
      }
    }
    c10::Storage st = shared ? *shared : cpu_storage_alias(si);
    at::Tensor cpu = cpu_alias(t, &st);
    aliases_.push_back(Alias{t, cpu, si, std::move(st), si->data_ptr().get()});
    return cpu;
  }

  void substitute(const c10::Argument& arg, c10::IValue& v) {
    if (v.isTensor()) {
      v = c10::IValue(alias_of(v.toTensor()));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      out.reserve(v.toTensorList().size());
      for (const at::Tensor& t : v.toTensorList()) out.push_back(alias_of(t));
      v = c10::IValue(std::move(out));
    } else if (v.isList() && is_optional_tensor_list(arg)) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : v.toListRef()) {
        out.push_back(e.isTensor() ? std::optional<at::Tensor>(alias_of(e.toTensor())) : std::nullopt);
      }
      v = c10::IValue(std::move(out));
    } else if (v.isDevice() && v.toDevice().type() == kNpu) {
      v = c10::IValue(c10::Device(c10::kCPU));
    }
  }

  void call_cpu_kernel() {
    try {
      op_.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack_);
    } catch (const c10::NotImplementedError&) {
      if (!op_.hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
        TORCH_CHECK_NOT_IMPLEMENTED(false, "The operator '", op_.schema().operator_name(),
                                    "' is not implemented for the npu device: npudist runs npu ops with their "
                                    "CPU kernels and this operator has no CPU kernel.");
      }
      throw;
    }
  }

  // An in-place/out= kernel may have resized or restrided an argument: carry that over to the npu tensor.
  void sync_arguments(const AdoptScope& adopt) {
    for (Alias& a : aliases_) {
      c10::StorageImpl* cs = a.cpu.storage().unsafeGetStorageImpl();
      if (cs == a.cpu_storage.unsafeGetStorageImpl()) {
        if (cs->data_ptr().get() != a.orig_data && a.npu_si->data_ptr().get() == a.orig_data) {
          // The CPU kernel reallocated the bytes (resize of an out= argument): move them to npu.
          c10::Storage moved = adopt_storage(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(cs)),
                                             device_, adopt);
          c10::StorageImpl* ms = moved.unsafeGetStorageImpl();
          if (ms == cs) {
            a.npu_si->set_data_ptr_noswap(cs->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU))));
            a.npu_si->set_nbytes(cs->nbytes());
          } else {
            a.npu_si->set_data_ptr_noswap(std::move(ms->mutable_data_ptr()));
            a.npu_si->set_nbytes(ms->nbytes());
          }
        }
      } else {
        // The kernel swapped the argument's storage (set_-style out= kernels).
        a.orig.unsafeGetTensorImpl()->set_storage_keep_dtype(adopt_storage(a.cpu.storage(), device_, adopt));
      }
      auto* impl = a.orig.unsafeGetTensorImpl();
      if (a.cpu.sizes() != a.orig.sizes() || a.cpu.strides() != a.orig.strides() ||
          a.cpu.storage_offset() != a.orig.storage_offset()) {
        impl->set_sizes_and_strides(a.cpu.sizes(), a.cpu.strides(), a.cpu.storage_offset());
      }
    }
  }

  // Sparse, quantized, nested and mkldnn tensors have no plain storage + strides to alias or adopt:
  // they are not npu tensors here (docs/device.md). Say so, naming the op, instead of failing deep inside.
  void check_representable(const at::Tensor& t, const std::string& what) const {
    TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested(),
                                "The operator '", op_.schema().operator_name(), "' is not supported on npu: ", what,
                                " a ", t.is_quantized() ? "quantized" : t.is_nested() ? "nested" : "non-strided (",
                                t.is_quantized() || t.is_nested() ? "" : c10::str(t.layout(), ")"),
                                " tensor, and npudist's npu tensors are dense and strided only.");
  }

  at::Tensor map_tensor(const at::Tensor& r, const AdoptScope& adopt, int64_t& max_numel) {
    if (!r.defined() || r.device().type() != c10::kCPU) return r;
    check_representable(r, "its CPU kernel returned");
    c10::TensorImpl* ri = r.unsafeGetTensorImpl();
    for (const Alias& a : aliases_) {
      if (a.cpu.unsafeGetTensorImpl() == ri) return a.orig;  // in-place / out=
    }
    c10::StorageImpl* rs = r.storage().unsafeGetStorageImpl();
    for (const Alias& a : aliases_) {
      if (a.cpu_storage.unsafeGetStorageImpl() == rs) {  // a view of an argument
        return make_npu_tensor(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(a.npu_si)), r);
      }
    }
    max_numel = std::max<int64_t>(max_numel, r.numel());
    return make_npu_tensor(adopt_storage(r.storage(), device_, adopt), r);
  }

  void map_result(c10::IValue& v, const AdoptScope& adopt, int64_t& max_numel) {
    if (v.isTensor()) {
      v = c10::IValue(map_tensor(v.toTensor(), adopt, max_numel));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      out.reserve(v.toTensorList().size());
      for (const at::Tensor& t : v.toTensorList()) out.push_back(map_tensor(t, adopt, max_numel));
      v = c10::IValue(std::move(out));
    }
  }

  const c10::OperatorHandle& op_;
  torch::jit::Stack* stack_;
  int device_ = -1;
  int64_t max_numel_ = 0;
  bool needs_generator_ = false;
  size_t generator_slot_ = 0;
  std::optional<at::Generator> generator_;
  std::vector<std::pair<std::string, c10::Device>> pending_cpu_;
  c10::SmallVector<Alias, 4> aliases_;
};

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { Fallback(op, stack).run(); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>()); }

}  // namespace

// Ops with both a CPU kernel and a CompositeExplicitAutograd kernel (e.g. native_layer_norm, whose
// composite kernel is a decomposition for backends without their own) would run the decomposition on
// npu and differ numerically from CPU. Route them to the CPU kernel through the fallback instead, so
// npu results are bitwise identical to CPU. Runs once, after libtorch registered its operators.
size_t register_cpu_kernel_redirects() {
  static std::unique_ptr<torch::Library> lib;
  if (lib) return 0;
  lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                         __LINE__);
  size_t n = 0;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      continue;
    }
    // Also ops with a CPU kernel and a CompositeImplicitAutograd one (e.g. mish_backward): CPU runs its own
    // kernel (a backend kernel takes precedence over the implicit decomposition), so npu must too.
    if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
      std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
      ++n;
    }
  }
  // Composite ops that choose a backend by device: on PrivateUse1, _convolution and convolution_backward
  // pick ConvBackend::Overrideable (convolution_overrideable, which nobody implements). Running their
  // composite kernel on the CPU aliases makes the choice CPU's (mkldnn / slow / depthwise kernels), so
  // npu convolutions are CPU's convolutions, bit for bit, on the same bytes.
  for (const char* composite : {"convolution", "_convolution", "_convolution.deprecated", "convolution_backward"}) {
    lib->impl(composite, torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
    ++n;
  }
  return n;
}
}  // namespace npudist
