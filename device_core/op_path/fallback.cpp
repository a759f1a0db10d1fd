// The zero-copy boxed fallback (op_path.h, docs/op_path.md): every aten op without an explicit npu kernel
// runs its CPU kernel directly on the npu bytes, inline or queued on the current stream.
//
// How: each npu argument is replaced by a CPU alias (a CPU tensor over the same bytes), the CPU kernel
// runs, and results are mapped back: a returned alias becomes the original npu tensor (in-place, out=),
// a result on an argument's storage becomes an npu view of that storage, a new result is adopted as npu.
//
// Launch (launch.h): under asynchronous launch the first call of a signature runs inline and is checked;
// later calls allocate the inferred outputs on the calling thread and queue the CPU kernel.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "allocator/npu_allocator.h"
#include "graph/graph_capture.h"
#include "launch/launch.h"
#include "npu_tensor.h"
#include "op_path/op_path.h"
#include "profiler/profiler.h"
#include "op_path/warning_probe.h"

namespace npudist::op_path {
namespace {

struct Alias {
  at::Tensor orig;           // the npu argument
  at::Tensor cpu;            // its CPU alias passed to the kernel
  c10::StorageImpl* npu_si;  // orig's storage
  c10::Storage cpu_storage;  // alias storage (shared by all arguments on npu_si)
  void* orig_data;
};

[[noreturn]] void fail_device_mismatch(const c10::OperatorHandle& op, const std::string& arg, c10::Device got,
                                       int device) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but got ", arg, " is on ", got,
              ", different from other tensors on ", npu_device(device), " (when checking argument in operator ",
              op.schema().operator_name(), ")");
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
    if (launch::may_queue(device_) && launch_async(begin)) return;
    launch::count_synchronous();
    launch::drain(device_);
    run_now(begin);
  }

  // The op's CPU kernel on the calling thread (synchronous; the caller ordered it after queued work).
  // `kernel_ns`: set to the kernel's wall time (the CPU kernel call alone).
  void run_now(size_t begin, int64_t* kernel_ns = nullptr) {
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
    {
      profiler::KernelScope kernel_event(op_, device_);
      launch::BusyScope busy(device_);  // torch.npu.utilization counts kernels run on this thread too
      const auto t0 = kernel_ns ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      call_cpu_kernel();
      if (kernel_ns) *kernel_ns = (std::chrono::steady_clock::now() - t0).count();
    }
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
    const bool cacheable = signature_key(op_, *stack_, begin, key, npu_args);
    std::shared_ptr<const Inferred> inf = cacheable ? find_inferred(key) : nullptr;
    if (!inf) {
      run_first_call(begin, cacheable ? &key : nullptr, npu_args);
      return true;
    }
    if (!inf->ok) return false;
    if (inf->view) {
      launch::count_metadata();  // an op whose outputs are views (e.g. _unsafe_view): metadata only
      run_now(begin);
      return true;
    }
    // A kernel cheaper than its hand-off to the worker runs here when the stream is idle (launch.h,
    // inline_kernel_ns). It then behaves as under blocking launch: a failure raises at the call.
    Inferred::KernelCost& kc = *inf->kernel_cost;
    const bool inline_candidate = kc.runs_inline(launch::kInlineBytes, launch::inline_kernel_ns());
    if (launch::take_inline(device_, inline_candidate)) {
      if (!kc.timing_inline()) {
        run_now(begin);
        return true;
      }
      int64_t kernel_ns = 0;
      run_now(begin, &kernel_ns);
      kc.add_inline_sample(kernel_ns);
      return true;
    }
    std::vector<at::Tensor> results;  // npu tensors to return, flattened
    std::vector<bool> fresh;          // per flattened return: newly allocated
    for (const Inferred::Out& o : inf->outs) {
      fresh.push_back(o.arg == Inferred::Out::kNew);  // an undefined return (kUndefined) stays undefined
      results.push_back(o.arg < 0 ? at::Tensor() : npu_args.at(static_cast<size_t>(o.arg)));
    }
    const std::optional<c10::OperatorHandle>& out_op = inf->out_op;

    // Commit: allocate outputs, build the CPU call, hand the arguments to the queued kernel. Kernels that ran
    // give their arguments' memory back first, so the outputs can reuse it.
    launch::release_finished();
    // The kernel sees its arguments and outputs through views that do not hold their blocks when the blocks are
    // reused in this stream's order (queued_storage_alias): a tensor the host drops goes back to the pool now.
    queued_stream_ = rt::api().get_stream(device_);
    std::vector<at::Tensor> outs;  // CPU aliases of the fresh outputs
    int64_t max_numel = max_numel_;
    {
      DeviceScope ds(device_);
      for (size_t i = 0; i < results.size(); ++i) {
        if (!fresh[i]) continue;
        const Inferred::Out& o = inf->outs[i];
        results[i] = at::detail::empty_strided_generic(o.sizes, o.strides, memory::allocator(),
                                                       c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), o.dtype);
        outs.push_back(queued_cpu_alias(results[i], queued_stream_));
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
    // The first launches of a signature are timed on the worker (Inferred::KernelCost): how long a kernel that
    // may run inline takes there is what an inline launch waits for (launch::take_inline).
    launch::LaunchCost cost;
    if (inline_candidate) cost.inline_ns = kc.fastest_ns.load(std::memory_order_relaxed);  // its time on the worker
    std::shared_ptr<Inferred::KernelCost> sampled;
    int64_t touched = 0;
    if (inf->kernel_cost->sampling()) {
      sampled = inf->kernel_cost;
      for (const at::Tensor& o : outs) touched += static_cast<int64_t>(o.numel() * o.element_size());
      for (const at::Tensor& t : npu_args) touched += static_cast<int64_t>(t.numel() * t.element_size());
    }
    launch::enqueue(device_, op_name(), [op = op_, out_op, call = std::move(call), keep = std::move(keep),
                                         outs = std::move(outs), fresh = std::move(fresh),
                                         sampled = std::move(sampled), touched]() mutable {
      run_sampled(sampled, touched, op, out_op, call, outs, fresh);
    }, cost);
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

  // A new signature runs synchronously once, and is queued from then on only if the CPU kernel's outputs
  // matched the Meta kernel's inference exactly (some Meta kernels differ, e.g. _embedding_bag's offset2bag),
  // it raised no warning (its warnings are part of the result the caller sees on every call, at the call) and
  // it flipped no argument's lazy conj/neg bit (a queued run learns that only when it ran, e.g.
  // linalg_lu_solve.out). `key` null: not cacheable, always synchronous.
  void run_first_call(size_t begin, const std::string* key, const std::vector<at::Tensor>& npu_args) {
    std::shared_ptr<const Inferred> inferred = key ? infer_outputs(op_, *stack_, begin, needs_generator_) : nullptr;
    launch::count_synchronous();
    launch::drain(device_);
    std::optional<torch::jit::Stack> call_args;  // for out_form_agrees: run_now replaces them by the returns
    if (inferred && inferred->out_op) call_args.emplace(stack_->begin() + static_cast<std::ptrdiff_t>(begin), stack_->end());
    auto bits = [](const at::Tensor& t) { return t.is_conj() * 2 + t.is_neg(); };
    std::vector<int> bits_before;
    for (const at::Tensor& t : npu_args) bits_before.push_back(bits(t));
    bool warned;
    {
      WarningProbe probe(/*forward=*/true);
      run_now(begin);
      warned = probe.warned();
    }
    if (!key) return;
    bool bits_changed = false;
    for (size_t i = 0; i < npu_args.size(); ++i) bits_changed |= bits_before[i] != bits(npu_args[i]);
    std::shared_ptr<const Inferred> checked =
        warned || bits_changed ? not_queueable() : verify_outputs(op_, inferred, *stack_, npu_args);
    if (checked->out_op) {
      std::vector<at::Tensor> results;
      for (size_t i = stack_->size() - checked->outs.size(); i < stack_->size(); ++i) results.push_back((*stack_)[i].toTensor());
      if (!out_form_agrees(*checked->out_op, *checked, std::move(*call_args), results)) {
        auto functional = std::make_shared<Inferred>(*checked);
        functional->out_op.reset();
        checked = std::move(functional);
      }
    }
    store_inferred(*key, std::move(checked));
  }

  // CPU time of the calling thread: unlike wall time, it does not count the time the thread was descheduled
  // by the machine's other processes. A kernel's intra-op threads are not counted: it can only err towards
  // "memory-bound", the safe side.
  static int64_t thread_cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }

  // The queued kernel, timed while its signature is being sampled (Inferred::KernelCost).
  static void run_sampled(const std::shared_ptr<Inferred::KernelCost>& kc, int64_t bytes,
                          const c10::OperatorHandle& op, const std::optional<c10::OperatorHandle>& out_op,
                          torch::jit::Stack& call, std::vector<at::Tensor>& outs, const std::vector<bool>& fresh) {
    if (!kc) {
      run_queued(op, out_op, call, outs, fresh);
      return;
    }
    const int64_t t0 = thread_cpu_ns();
    run_queued(op, out_op, call, outs, fresh);
    kc->add_sample(thread_cpu_ns() - t0, bytes);
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
        // `o` keeps the bytes for the kernel's run (or the stream's order does): the second view needs no hold.
        c10::Storage again = cpu_storage_view(const_cast<void*>(o.storage().data()), o.storage().nbytes());
        dst.push_back(cpu_alias(o, &again));
        call.emplace_back(o);
      }
      out_op->redispatchBoxed(cpu, &call);
      for (size_t i = 0; i < outs.size(); ++i) {
        if (outs[i].const_data_ptr() == data[i]) continue;
        // An out= kernel that gave its output new memory although the signature's check saw it write in place
        // (out_form_agrees; a data-dependent path): the result is correct but elsewhere, so move it in.
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

  const char* op_name() const { return op_.schema().name().c_str(); }

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
    c10::Storage st = shared ? *shared : queued_stream_ >= 0 ? queued_storage_alias(si, queued_stream_)
                                                             : cpu_storage_alias(si);
    at::Tensor cpu = cpu_alias(t, &st);
    aliases_.push_back(Alias{t, cpu, si, std::move(st), si->data_ptr().get()});
    return cpu;
  }

  void substitute(const c10::Argument& arg, c10::IValue& v) {
    map_argument_tensors(arg, v, [this](const at::Tensor& t) { return alias_of(t); }, c10::Device(c10::kCPU));
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
  int64_t queued_stream_ = -1;  // the stream the op's kernel is queued on, once launch_async commits
  std::vector<std::pair<std::string, c10::Device>> pending_cpu_;
  c10::SmallVector<Alias, 4> aliases_;
};

}  // namespace

void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { Fallback(op, stack).run(); }

namespace {
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>()); }
}  // namespace

}  // namespace npudist::op_path
