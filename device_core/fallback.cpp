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

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "allocator/npu_allocator.h"
#include "graph_capture.h"
#include "launch.h"
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
  const bool src_npu = src.device().type() == kNpu, dst_npu = dst.device().type() == kNpu;
  if (src_npu && dst_npu && src.device() == dst.device() && !launch::blocking() && !profiler::active()) {
    // npu -> npu: a queued kernel, like every other op. The aliases keep both storages alive until it ran.
    at::Tensor src_cpu = cpu_alias(src), dst_cpu = cpu_alias(dst);
    launch::enqueue(dst.device().index(), "aten::copy_", [src_cpu, dst_cpu]() mutable { dst_cpu.copy_(src_cpu); });
    return;
  }
  // Host <-> npu (and cross-device) copies touch the bytes now, after the queued work of the npu sides:
  // a D2H copy waits like cudaMemcpy, an H2D copy reads the pageable source before returning (so the
  // caller may reuse it), whether or not non_blocking was asked for.
  launch::count_synchronous();
  if (src_npu) launch::drain(src.device().index());
  if (dst_npu && !(src_npu && src.device() == dst.device())) launch::drain(dst.device().index());
  at::Tensor src_cpu = as_cpu(src, "source");
  at::Tensor dst_cpu = as_cpu(dst, "destination");
  dst_cpu.copy_(src_cpu, non_blocking);
}

// HOST-MEMORY: reads the element in place; a real device copies it to the host (aclrtMemcpy D2H) first.
c10::Scalar read_scalar(const at::Tensor& t) {
  launch::count_synchronous();
  launch::drain(t.device().index());
  return at::_local_scalar_dense(cpu_alias(t));
}

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

bool has_written_argument(const c10::FunctionSchema& schema) {
  for (const c10::Argument& a : schema.arguments()) {
    if (a.alias_info() && a.alias_info()->isWrite()) return true;
  }
  return false;
}

// View ops (every return aliases an argument, nothing is written) read no data: they run at once.
bool is_view_schema(const c10::FunctionSchema& schema) {
  if (schema.returns().empty() || has_written_argument(schema)) return false;
  for (const c10::Argument& r : schema.returns()) {
    if (!r.alias_info() || r.alias_info()->isWrite()) return false;
  }
  return true;
}

bool is_tensor_type(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; }
bool is_tensor_list_type(const c10::TypePtr& t) {
  return t->kind() == c10::TypeKind::ListType && is_tensor_type(t->castRaw<c10::ListType>()->getElementType());
}

// Ops that may be queued: they return only tensors (a bool/Scalar/int result is data the caller needs
// now) and their output shapes do not depend on the data. The Meta kernel refuses most data-dependent
// ops by itself; these are named so that a permissive Meta kernel cannot make them asynchronous.
bool async_candidate(const c10::FunctionSchema& schema) {
  static const std::unordered_set<std::string> kDataDependent = {
      "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select", "aten::unique",
      "aten::_unique", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim",
      "aten::unique_dim_consecutive", "aten::repeat_interleave", "aten::bincount", "aten::histc",
      "aten::histogram", "aten::_local_scalar_dense", "aten::_assert_async", "aten::_assert_scalar",
      "aten::_print", "aten::equal", "aten::allclose", "aten::is_nonzero"};
  for (const c10::Argument& r : schema.returns()) {
    if (!is_tensor_type(r.type()) && !is_tensor_list_type(r.type())) return false;
  }
  return kDataDependent.count(schema.name()) == 0;
}

// The out= overload that runs a functional op's own kernel: only ops whose functional form is the structured
// delegate of that overload (torchgen's `structured_delegate:`, table generated by setup.py) compute the same
// thing both ways. Other out= kernels follow their own contract: binary_cross_entropy.out expects a buffer the
// size of the input and reduces into it; writing a functional result through it gave wrong losses.
std::optional<c10::OperatorHandle> find_out_overload(const c10::OperatorHandle& op) {
  static const auto* table = new std::unordered_map<std::string, std::string>{
#define NPUDIST_STRUCTURED(name, overload, out) {std::string("aten::") + name + "." + overload, out},
#include "structured_delegates.inc"
#undef NPUDIST_STRUCTURED
  };
  const c10::FunctionSchema& fs = op.schema();
  auto it = table->find(fs.name() + "." + fs.overload_name());
  if (it == table->end()) return std::nullopt;
  auto h = c10::Dispatcher::singleton().findOp(c10::OperatorName(fs.name(), it->second));
  if (!h || !h->hasSchema()) return std::nullopt;
  // The structured contract: the functional arguments, then one written keyword-only tensor per return.
  const c10::FunctionSchema& cs = h->schema();
  const size_t n = fs.arguments().size(), nout = fs.returns().size();
  if (cs.arguments().size() != n + nout || cs.returns().size() != nout) return std::nullopt;
  for (size_t i = 0; i < n; ++i) {
    if (cs.arguments()[i].name() != fs.arguments()[i].name() || *cs.arguments()[i].type() != *fs.arguments()[i].type()) {
      return std::nullopt;
    }
  }
  for (size_t i = n; i < n + nout; ++i) {
    const c10::Argument& a = cs.arguments()[i];
    if (!a.kwarg_only() || !is_tensor_type(a.type()) || !a.alias_info() || !a.alias_info()->isWrite()) {
      return std::nullopt;
    }
  }
  return h;
}

// Notes whether the code in its scope raised a C++ warning (TORCH_WARN), forwarding each one to the handler it
// replaced (the Python warning handler of the calling op) or, for a probe whose warnings are not the caller's,
// swallowing it.
class WarningProbe final : public c10::WarningHandler {
 public:
  explicit WarningProbe(bool forward) : prev_(c10::WarningUtils::get_warning_handler()), forward_(forward) {
    c10::WarningUtils::set_warning_handler(this);
  }
  ~WarningProbe() override { c10::WarningUtils::set_warning_handler(prev_); }
  WarningProbe(const WarningProbe&) = delete;
  WarningProbe& operator=(const WarningProbe&) = delete;
  void process(const c10::Warning& warning) override {
    warned_ = true;
    if (forward_) prev_->process(warning);
  }
  bool warned() const { return warned_; }

 private:
  c10::WarningHandler* prev_;
  bool forward_;
  bool warned_ = false;
};

// What the Meta kernel inferred for one argument signature (see Fallback::signature).
struct Inferred {
  struct Out {
    int arg;  // >= 0: the npu argument (in visiting order) written in place; -1: new tensor; -2: a view
    std::vector<int64_t> sizes, strides;
    c10::ScalarType dtype;
  };
  bool ok = false;         // false: run synchronously
  bool view = false;       // every output is a view of an argument: run at once, no data access
  // Set when every return is a new tensor (no lists) and the op's out= overload provably computes the same
  // thing into preallocated outputs (find_out_overload, out_form_for): the queued kernel writes them directly.
  std::optional<c10::OperatorHandle> out_op;
  std::vector<Out> outs;   // flattened returns
  std::vector<int64_t> list_sizes;  // per return: -1 for a tensor, else the list's length
};

class InferredCache {
 public:
  std::shared_ptr<const Inferred> find(const std::string& key) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  void store(const std::string& key, std::shared_ptr<const Inferred> inf) {
    std::lock_guard<std::mutex> lk(mu_);
    if (map_.size() >= kMaxEntries) map_.clear();  // a program with ever-new shapes: start over
    map_.emplace(key, std::move(inf));
  }

 private:
  static constexpr size_t kMaxEntries = 8192;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Inferred>> map_;
};

InferredCache& inferred_cache() {
  static auto* cache = new InferredCache();  // never destroyed: ops may run during static destruction
  return *cache;
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
    if (is_view_schema(op_.schema())) {  // metadata only: no data access, nothing to wait for
      launch::count_metadata();
      run_now(begin);
      return;
    }
    // NPUGraph capture records ops on the calling thread as they run: capturing streams run synchronously.
    if (!launch::blocking() && !profiler::active() && !graph::any_capture_active() && launch_async(begin)) return;
    launch::count_synchronous();
    launch::drain(device_);
    run_now(begin);
  }

  // The op's CPU kernel on the calling thread (synchronous; the caller ordered it after queued work).
  void run_now(size_t begin) {
    const auto& args = op_.schema().arguments();
    for (size_t i = 0; i < args.size(); ++i) substitute(args[i], (*stack_)[begin + i]);

    DeviceScope ds(device_);
    AdoptScope adopt(device_);
    c10::GeneratorImpl* gen = needs_generator_ ? npu_generator_for(generator_, device_) : nullptr;
    // ---- NPUGraph capture hook (graph_capture.h): record this op if its stream is capturing ----
    graph::OpRecordingPtr recording;
    if (graph::any_capture_active()) {
      std::vector<c10::StorageImpl*> npu_storages;
      for (const Alias& a : aliases_) npu_storages.push_back(a.npu_si);
      recording = graph::begin_op(op_, device_, *stack_, args.size(), !pending_cpu_.empty(),
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

  // ---- asynchronous launch -----------------------------------------------------------------------
  // Output inference: the op's Meta kernel on meta tensors with the arguments' geometry. Outputs are
  // allocated on npu with the Meta kernel's strides and the CPU kernel is queued on the current stream,
  // writing into them (through the op's out= overload when it has one, else functional + copy). Returns
  // false, having changed nothing, when the op cannot be inferred that way: it then runs synchronously.
  bool launch_async(size_t begin) {
    const auto& schema = op_.schema();
    if (!pending_cpu_.empty() || !async_candidate(schema)) return false;
    const auto& args = schema.arguments();
    // Output geometry depends only on the arguments' metadata: look it up by that, and run the Meta kernel
    // (Python for many ops) only for a new signature.
    std::string key;
    key.reserve(256);  // most keys fit: one allocation instead of a growth per argument
    std::vector<at::Tensor> npu_args;  // in the order to_meta visits them
    npu_args.reserve(4);
    const bool cacheable = signature(begin, key, npu_args);
    std::shared_ptr<const Inferred> inf = cacheable ? inferred_cache().find(key) : nullptr;
    if (!inf) {
      // A new signature runs synchronously once, and is queued from then on only if the CPU kernel's outputs
      // matched the Meta kernel's inference exactly (some Meta kernels differ, e.g. _embedding_bag's
      // offset2bag); not cacheable signatures always run synchronously.
      // A signature whose kernel warns stays synchronous too: its warnings are part of the result the caller
      // sees on every call, raised at the call (a queued kernel's warning would arrive at a later point).
      std::shared_ptr<const Inferred> inferred = cacheable ? infer(begin) : nullptr;
      launch::count_synchronous();
      launch::drain(device_);
      std::optional<torch::jit::Stack> call_args;  // for out_form_agrees: run_now replaces them by the returns
      if (inferred && inferred->out_op) call_args.emplace(stack_->begin() + static_cast<std::ptrdiff_t>(begin), stack_->end());
      // What a kernel may change on its arguments besides their bytes, which a queued run could not carry over
      // (it learns them only when it ran): a lazy conj/neg bit the CPU kernel flipped, e.g. linalg_lu_solve.out.
      std::vector<int> bits;
      for (const at::Tensor& t : npu_args) bits.push_back(t.is_conj() * 2 + t.is_neg());
      bool warned;
      {
        WarningProbe probe(/*forward=*/true);
        run_now(begin);
        warned = probe.warned();
      }
      if (!cacheable) return true;
      bool bits_changed = false;
      for (size_t i = 0; i < npu_args.size(); ++i) bits_changed |= bits[i] != npu_args[i].is_conj() * 2 + npu_args[i].is_neg();
      std::shared_ptr<const Inferred> checked = warned || bits_changed ? not_queueable() : verify(inferred, npu_args);
      if (checked->out_op) {
        std::vector<at::Tensor> results;
        for (size_t i = stack_->size() - checked->outs.size(); i < stack_->size(); ++i) results.push_back((*stack_)[i].toTensor());
        if (!out_form_agrees(*checked->out_op, *checked, std::move(*call_args), results)) {
          auto functional = std::make_shared<Inferred>(*checked);
          functional->out_op.reset();
          checked = std::move(functional);
        }
      }
      inferred_cache().store(key, std::move(checked));
      return true;
    }
    if (!inf->ok) return false;
    if (inf->view) {
      launch::count_metadata();  // an op whose outputs are views (e.g. _unsafe_view): metadata only
      run_now(begin);
      return true;
    }
    std::vector<at::Tensor> results;  // npu tensors to return, flattened
    std::vector<bool> fresh;          // per flattened return: newly allocated
    for (const Inferred::Out& o : inf->outs) {
      fresh.push_back(o.arg < 0);
      results.push_back(o.arg < 0 ? at::Tensor() : npu_args.at(static_cast<size_t>(o.arg)));
    }
    const std::optional<c10::OperatorHandle>& out_op = inf->out_op;

    // Commit: allocate outputs, build the CPU call, hand the arguments to the queued kernel. Kernels that ran
    // give their arguments' memory back first, so the outputs can reuse it.
    launch::release_finished();
    std::vector<at::Tensor> outs;  // CPU aliases of the fresh outputs
    int64_t max_numel = max_numel_;
    {
      DeviceScope ds(device_);
      for (size_t i = 0; i < results.size(); ++i) {
        if (!fresh[i]) continue;
        const Inferred::Out& o = inf->outs[i];
        results[i] = at::detail::empty_strided_generic(o.sizes, o.strides, memory::allocator(),
                                                       c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), o.dtype);
        outs.push_back(cpu_alias(results[i]));
        max_numel = std::max<int64_t>(max_numel, results[i].numel());
      }
    }
    for (size_t i = 0; i < args.size(); ++i) {
      c10::IValue& v = (*stack_)[begin + i];
      // A CPU scalar tensor (not a wrapped Python number) may be changed by the caller after the call.
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_cpu() &&
          !v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
        v = c10::IValue(v.toTensor().clone());
      }
      substitute(args[i], v);
    }
    if (needs_generator_) {  // the random stream is reserved in launch order, as in blocking mode
      c10::GeneratorImpl* gen = npu_generator_for(generator_, device_);
      std::lock_guard<std::mutex> gen_lock(npu_generator_mutex(gen));
      (*stack_)[begin + generator_slot_] = c10::IValue(fork_random_op(gen));
      end_random_op(gen, static_cast<uint64_t>(max_numel));
    }
    torch::jit::Stack call(std::make_move_iterator(stack_->begin() + static_cast<std::ptrdiff_t>(begin)),
                           std::make_move_iterator(stack_->end()));
    stack_->resize(begin);
    // Memory is freed on the thread that allocated it (see launch.cpp, "Kernels that ran"): `keep` holds the
    // arguments the boxed call consumes on the worker, so they die with the closure on the host; the
    // worker's own allocations (functional results) die on the worker (run_queued clears `call`).
    std::vector<c10::IValue> keep(call.begin(), call.end());
    if (out_op) call.reserve(call.size() + outs.size());  // the worker appends the outputs without reallocating
    launch::enqueue(device_, op_name(), [op = op_, out_op, call = std::move(call), keep = std::move(keep),
                                         outs = std::move(outs), fresh = std::move(fresh)]() mutable {
      run_queued(op, out_op, call, outs, fresh);
    });
    // Push the returns in schema order (lists rebuilt from the flattened results).
    size_t k = 0;
    for (int64_t n : inf->list_sizes) {
      if (n < 0) {
        stack_->emplace_back(results[k++]);
      } else {
        c10::List<at::Tensor> out;
        for (int64_t j = 0; j < n; ++j) out.push_back(results[k++]);
        stack_->emplace_back(std::move(out));
      }
    }
    return true;
  }

  // The queued kernel (on the stream's worker).
  static void run_queued(const c10::OperatorHandle& op, const std::optional<c10::OperatorHandle>& out_op,
                         torch::jit::Stack& call, std::vector<at::Tensor>& outs, const std::vector<bool>& fresh) {
    const auto cpu = c10::DispatchKeySet(c10::DispatchKey::CPU);
    if (out_op) {
      std::vector<const void*> data;
      std::vector<at::Tensor> dst;  // second aliases of the npu outputs: an out= kernel may swap an alias's storage
      for (const at::Tensor& o : outs) {
        data.push_back(o.const_data_ptr());
        auto* npu_si = static_cast<c10::StorageImpl*>(o.storage().data_ptr().get_context());
        c10::Storage again = cpu_storage_alias(npu_si);
        dst.push_back(cpu_alias(o, &again));
        call.emplace_back(o);
      }
      out_op->redispatchBoxed(cpu, &call);
      for (size_t i = 0; i < outs.size(); ++i) {
        if (outs[i].const_data_ptr() == data[i]) continue;
        // Some out= kernels give their output new memory even when its shape is already right (mse_loss.out
        // with a reduction): the result is correct but elsewhere, so move it into the npu output.
        TORCH_CHECK(outs[i].sizes() == dst[i].sizes() && outs[i].scalar_type() == dst[i].scalar_type(),
                    "the CPU kernel of ", out_op->schema().operator_name(), " returned ", outs[i].sizes(), " ",
                    outs[i].scalar_type(), " but its Meta kernel inferred ", dst[i].sizes(), " ",
                    dst[i].scalar_type());
        dst[i].copy_(outs[i]);
      }
      call.clear();
      return;
    }
    op.redispatchBoxed(cpu, &call);
    size_t k = 0, o = 0;
    auto take = [&](const at::Tensor& r) {
      if (!fresh[k++]) return;
      at::Tensor& dst = outs[o++];
      TORCH_CHECK(r.sizes() == dst.sizes() && r.scalar_type() == dst.scalar_type(), "the CPU kernel of ",
                  op.schema().operator_name(), " returned ", r.sizes(), " ", r.scalar_type(),
                  " but its Meta kernel inferred ", dst.sizes(), " ", dst.scalar_type());
      dst.copy_(r);
    };
    for (const c10::IValue& v : call) {
      if (v.isTensor()) take(v.toTensor());
      else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) take(t);
    }
    call.clear();  // the results were allocated here: free them here
  }

  // Runs the Meta kernel on meta stand-ins of the arguments and describes the outputs (not ok: the op
  // runs synchronously).
  std::shared_ptr<const Inferred> infer(size_t begin) {
    auto inf = std::make_shared<Inferred>();
    const auto& args = op_.schema().arguments();
    metas_.clear();
    torch::jit::Stack meta(stack_->begin() + static_cast<std::ptrdiff_t>(begin), stack_->end());
    for (size_t i = 0; i < args.size(); ++i) to_meta(args[i], meta[i]);
    try {
      op_.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
    } catch (const std::exception&) {
      return inf;  // no Meta kernel, data-dependent output, or a bad argument (the CPU kernel reports it)
    }
    for (const MetaArg& m : metas_) {
      if (m.meta.sizes() != m.orig.sizes() || m.meta.strides() != m.orig.strides() ||
          m.meta.storage_offset() != m.orig.storage_offset() || m.meta.is_conj() != m.orig.is_conj() ||
          m.meta.is_neg() != m.orig.is_neg()) {
        return inf;  // the op changes an argument's geometry or conj/neg bit (e.g. an empty out=): synchronous
      }
    }
    bool any_view = false, any_new = false, lists = false;
    for (const c10::IValue& v : meta) {
      if (v.isTensor()) {
        inf->list_sizes.push_back(-1);
        if (!classify(v.toTensor(), *inf, any_view, any_new)) return inf;
      } else if (v.isTensorList()) {
        lists = true;
        inf->list_sizes.push_back(static_cast<int64_t>(v.toTensorList().size()));
        for (const at::Tensor& t : v.toTensorList()) {
          if (!classify(t, *inf, any_view, any_new)) return inf;
        }
      } else {
        return inf;
      }
    }
    if (any_view) {
      if (any_new || has_written_argument(op_.schema())) return inf;
      inf->view = true;
    }
    // The out= overload is a candidate when every return is a new tensor, nothing is written and no random
    // numbers are drawn (checking it would draw them again); out_form_agrees decides after the first call.
    if (any_new && !lists && !needs_generator_ && !has_written_argument(op_.schema()) &&
        std::all_of(inf->outs.begin(), inf->outs.end(), [](const Inferred::Out& o) { return o.arg < 0; })) {
      inf->out_op = find_out_overload(op_);
    }
    inf->ok = true;
    return inf;
  }

  static std::shared_ptr<const Inferred> not_queueable() {
    static const auto not_ok = std::make_shared<const Inferred>();
    return not_ok;
  }

  // Whether the op's out= overload, run on this call's arguments into fresh outputs laid out as inferred,
  // computes exactly the functional results (`results`, bit for bit), in place and without warning. Run once
  // per signature, after the synchronous first call. Why not trust the structured table alone: a structured
  // kernel may build its output in steps (mse_loss.out with a reduction resizes a preallocated scalar output
  // to the input's shape and back, warning about the resize on every call).
  bool out_form_agrees(const c10::OperatorHandle& out_op, const Inferred& inf, torch::jit::Stack call,
                       const std::vector<at::Tensor>& results) {
    const auto& args = op_.schema().arguments();
    for (size_t i = 0; i < args.size(); ++i) substitute(args[i], call[i]);
    std::vector<at::Tensor> outs;
    for (const Inferred::Out& o : inf.outs) {
      outs.push_back(at::empty_strided(o.sizes, o.strides, at::TensorOptions().dtype(o.dtype)));
      call.emplace_back(outs.back());
    }
    std::vector<const void*> data;
    for (const at::Tensor& o : outs) data.push_back(o.const_data_ptr());
    WarningProbe probe(/*forward=*/false);
    try {
      out_op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &call);
    } catch (const std::exception&) {
      return false;
    }
    if (probe.warned() || results.size() != outs.size()) return false;
    for (size_t i = 0; i < outs.size(); ++i) {
      const Inferred::Out& o = inf.outs[i];
      if (outs[i].const_data_ptr() != data[i] || outs[i].sizes() != c10::IntArrayRef(o.sizes) ||
          outs[i].strides() != c10::IntArrayRef(o.strides) || results[i].nbytes() != outs[i].nbytes()) {
        return false;
      }
      // HOST-MEMORY: compares the npu result's bytes in place (the call above ran synchronously).
      if (std::memcmp(outs[i].const_data_ptr(), results[i].const_data_ptr(), outs[i].nbytes()) != 0) return false;
    }
    return true;
  }

  // `inf` if the synchronous run's returns (on the stack) are exactly what it predicted, else a not-ok one.
  std::shared_ptr<const Inferred> verify(const std::shared_ptr<const Inferred>& inf,
                                         const std::vector<at::Tensor>& npu_args) const {
    const auto& not_ok = not_queueable();
    if (!inf->ok || inf->view) return inf;
    const size_t nret = op_.schema().returns().size();
    if (inf->list_sizes.size() != nret) return not_ok;
    size_t k = 0;
    auto matches = [&](const at::Tensor& t) {
      if (k >= inf->outs.size()) return false;
      const Inferred::Out& o = inf->outs[k++];
      if (o.arg >= 0) return t.unsafeGetTensorImpl() == npu_args.at(static_cast<size_t>(o.arg)).unsafeGetTensorImpl();
      return t.defined() && t.device().type() == kNpu && t.storage_offset() == 0 && t.scalar_type() == o.dtype &&
             t.sizes() == c10::IntArrayRef(o.sizes) && t.strides() == c10::IntArrayRef(o.strides);
    };
    for (size_t r = 0; r < nret; ++r) {
      const c10::IValue& v = (*stack_)[stack_->size() - nret + r];
      const int64_t n = inf->list_sizes[r];
      if (n < 0) {
        if (!v.isTensor() || !matches(v.toTensor())) return not_ok;
      } else {
        if (!v.isTensorList() || static_cast<int64_t>(v.toTensorList().size()) != n) return not_ok;
        for (const at::Tensor& t : v.toTensorList()) {
          if (!matches(t)) return not_ok;
        }
      }
    }
    return k == inf->outs.size() ? inf : not_ok;
  }

  // A meta return: the meta alias of an argument (written in place), a view of an argument's storage, or
  // a new dense tensor to allocate. False for what npu outputs cannot be preallocated for.
  bool classify(const at::Tensor& r, Inferred& inf, bool& any_view, bool& any_new) {
    if (!r.defined() || !r.is_meta()) return false;
    for (size_t i = 0; i < metas_.size(); ++i) {
      if (metas_[i].meta.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) {
        inf.outs.push_back(Inferred::Out{static_cast<int>(i), {}, {}, r.scalar_type()});
        return true;
      }
    }
    for (const MetaArg& m : metas_) {
      if (m.meta.storage().unsafeGetStorageImpl() == r.storage().unsafeGetStorageImpl()) {
        any_view = true;
        inf.outs.push_back(Inferred::Out{-2, {}, {}, r.scalar_type()});
        return true;
      }
    }
    if (r.storage_offset() != 0 || !r.is_non_overlapping_and_dense() || r.is_conj() || r.is_neg()) return false;
    any_new = true;
    inf.outs.push_back(Inferred::Out{-1, r.sizes().vec(), r.strides().vec(), r.scalar_type()});
    return true;
  }

  // The key of everything a Meta kernel can see: per npu tensor its dtype, geometry, storage size and which
  // earlier argument shares its storage; per CPU tensor its dtype, rank and wrapped-number bit; the values
  // of all other arguments. False (not cacheable) for argument kinds it does not encode.
  bool float_values_shape_outputs() const {
    const std::string& name = op_.schema().name();
    return name == "aten::arange" || name == "aten::range";
  }

  bool signature(size_t begin, std::string& key, std::vector<at::Tensor>& npu_args) const {
    auto put = [&key](const void* p, size_t n) { key.append(static_cast<const char*>(p), n); };
    auto put_i = [&put](int64_t v) { put(&v, sizeof v); };
    const void* op_id = &op_.schema();
    put(&op_id, sizeof op_id);
    std::vector<const c10::StorageImpl*> storages;
    auto put_tensor = [&](const at::Tensor& t) {
      if (!t.defined()) return put_i(-50);
      put_i(static_cast<int64_t>(t.scalar_type()));
      if (t.device().type() != kNpu) {
        put_i(-100 - t.dim());
        return put_i(t.unsafeGetTensorImpl()->is_wrapped_number());
      }
      npu_args.push_back(t);
      const c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
      auto it = std::find(storages.begin(), storages.end(), si);
      put_i(it - storages.begin());
      if (it == storages.end()) storages.push_back(si);
      put_i(static_cast<int64_t>(si->nbytes()));
      put_i(t.dim());
      for (int64_t d : t.sizes()) put_i(d);
      for (int64_t d : t.strides()) put_i(d);
      put_i(t.storage_offset());
      put_i(t.is_conj() * 2 + t.is_neg());
    };
    const auto& args = op_.schema().arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& v = (*stack_)[begin + i];
      // Each kind writes a distinct marker first, so different kinds never produce the same bytes.
      if (v.isTensor()) {
        put_i(-1);
        put_tensor(v.toTensor());
      } else if (v.isTensorList()) {
        put_i(-2);
        put_i(static_cast<int64_t>(v.toTensorList().size()));
        for (const at::Tensor& t : v.toTensorList()) put_tensor(t);
      } else if (v.isList() && is_optional_tensor_list(args[i])) {
        put_i(-3);
        put_i(static_cast<int64_t>(v.toListRef().size()));
        for (const c10::IValue& e : v.toListRef()) {
          if (e.isTensor()) put_tensor(e.toTensor());
          else put_i(-51);
        }
      } else if (v.isInt() || v.isBool()) {
        put_i(v.isInt() ? -4 : -5);
        put_i(v.isInt() ? v.toInt() : v.toBool());
      } else if (v.isDouble()) {
        // A float's value decides no output geometry except arange/range's length: elsewhere it stays out of
        // the key, so a scalar that changes every step (Adam's step size in addcdiv_) reuses one signature
        // instead of running synchronously (draining the stream) each step as a new one.
        put_i(-6);
        if (float_values_shape_outputs()) {
          double d = v.toDouble();
          put(&d, sizeof d);
        }
      } else if (v.isIntList()) {
        put_i(-7);
        put_i(static_cast<int64_t>(v.toIntList().size()));
        for (int64_t x : v.toIntList()) put_i(x);
      } else if (v.isString()) {
        put_i(-8);
        put_i(static_cast<int64_t>(v.toStringRef().size()));
        key += v.toStringRef();
      } else if (v.isDevice()) {
        put_i(-9);
        put_i(static_cast<int64_t>(v.toDevice().type()));
      } else if (v.isComplexDouble()) {
        put_i(-10);
        c10::complex<double> c = v.toComplexDouble();
        put(&c, sizeof c);
      } else if (v.isNone() || v.isGenerator()) {
        put_i(v.isNone() ? -11 : -12);
      } else {
        return false;
      }
    }
    return true;
  }

  void to_meta(const c10::Argument& arg, c10::IValue& v) {
    if (v.isTensor()) {
      v = c10::IValue(meta_of(v.toTensor()));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(meta_of(t));
      v = c10::IValue(std::move(out));
    } else if (v.isList() && is_optional_tensor_list(arg)) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : v.toListRef()) {
        out.push_back(e.isTensor() ? std::optional<at::Tensor>(meta_of(e.toTensor())) : std::nullopt);
      }
      v = c10::IValue(std::move(out));
    } else if (v.isDevice() && v.toDevice().type() == kNpu) {
      v = c10::IValue(c10::Device(c10::kMeta));
    }
  }

  // A meta tensor with t's geometry; arguments on one npu storage share one meta storage.
  at::Tensor meta_of(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNpu) return t;
    c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
    std::optional<c10::Storage> storage;
    for (const MetaArg& m : metas_) {
      if (m.orig.storage().unsafeGetStorageImpl() == si) storage = m.meta.storage();
    }
    if (!storage) {
      storage = c10::Storage(c10::Storage::use_byte_size_t(), si->nbytes(), c10::DataPtr(nullptr, c10::Device(c10::kMeta)),
                             c10::GetAllocator(c10::kMeta), /*resizable=*/true);
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(*storage), c10::DispatchKeySet(c10::DispatchKey::Meta),
                                                     t.dtype());
    impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    if (t.is_conj()) impl->_set_conj(true);
    if (t.is_neg()) impl->_set_neg(true);
    at::Tensor m(std::move(impl));
    metas_.push_back(MetaArg{t, m});
    return m;
  }

  const char* op_name() const { return op_.schema().name().c_str(); }

 private:
  struct MetaArg {
    at::Tensor orig;  // the npu argument
    at::Tensor meta;  // its meta stand-in
  };
  c10::SmallVector<MetaArg, 4> metas_;

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
      // A kernel may also flip the lazy conj/neg bit of its output (linalg_lu_solve.out with left=False
      // conjugate-transposes `out` in place and marks it conjugated): the npu tensor must say the same.
      if (a.cpu.is_conj() != a.orig.is_conj()) impl->_set_conj(a.cpu.is_conj());
      if (a.cpu.is_neg() != a.orig.is_neg()) impl->_set_neg(a.cpu.is_neg());
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
  // In-place ops with only a CompositeExplicitAutograd kernel (conj_physical_, logical_not_, the _foreach_*_
  // family, ...): some of those kernels call a CPU DispatchStub directly, which on an npu tensor fails with
  // "DispatchStub: missing kernel for npu". Run them as one CPU kernel on the aliases instead, like every
  // other op (one queued kernel for a whole _foreach_ list, too). Not the in-place view ops (squeeze_, t_,
  // ...: metadata only, their composite kernels are right on npu), nor copy_ (npu's own copy path) and
  // index_put_ (its _index_put_impl_ is redirected above).
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0 || name.name.back() != '_' || name.name == "aten::copy_" ||
        name.name == "aten::index_put_") {
      continue;
    }
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !op->hasSchema() || op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) || op->hasTag(at::Tag::inplace_view)) {
      continue;
    }
    const auto& args = op->schema().arguments();
    if (args.empty() || !args[0].alias_info() || !args[0].alias_info()->isWrite()) continue;
    std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
    ++n;
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
