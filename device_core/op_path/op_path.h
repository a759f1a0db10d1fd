// The path of an npu op that has no npu kernel of its own (docs/op_path.md): its CPU kernel runs on CPU
// aliases of the npu bytes, inline or queued on the current stream. The units:
//   op_schema.cpp     what a schema allows: views, written arguments, queueable returns, the out= overload
//   op_signature.cpp  the signature key of a call and the outputs its Meta kernel infers (cached per key)
//   fallback.cpp      the boxed fallback: one op, inline or queued, results mapped back to npu
//   op_redirects.cpp  which aten ops take the fallback although they have other kernels
// The CPU aliases of npu tensors and the adoption of CPU-kernel outputs it uses are primitives below every
// room (npu_tensor.h, defined in npu_tensor.cpp).
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace npudist::op_path {

// ---- op_schema.cpp -------------------------------------------------------------------------------------
// Ops whose CPU kernels legitimately take CPU tensors next to device tensors (as CUDA allows).
bool allows_cpu_tensors(const c10::OperatorName& name);
bool is_optional_generator(const c10::Argument& a);
bool is_optional_tensor_list(const c10::Argument& a);
bool has_written_argument(const c10::FunctionSchema& schema);
// View ops (every return aliases an argument, nothing is written) read no data: they run at once.
bool is_view_schema(const c10::FunctionSchema& schema);
// Ops that may be queued: only tensor returns, output shapes independent of the data.
bool async_candidate(const c10::FunctionSchema& schema);
// The out= overload whose kernel is the functional op's own (its structured delegate), if there is one.
std::optional<c10::OperatorHandle> find_out_overload(const c10::OperatorHandle& op);

// Replaces every tensor of the argument value `v` (a tensor, a tensor list, an optional-tensor list) by
// `fn(tensor)`, and an npu device value by `device`: how a call's arguments become CPU aliases or meta
// stand-ins.
template <typename Fn>
void map_argument_tensors(const c10::Argument& arg, c10::IValue& v, Fn&& fn, c10::Device device) {
  if (v.isTensor()) {
    v = c10::IValue(fn(v.toTensor()));
  } else if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(v.toTensorList().size());
    for (const at::Tensor& t : v.toTensorList()) out.push_back(fn(t));
    v = c10::IValue(std::move(out));
  } else if (v.isList() && is_optional_tensor_list(arg)) {
    c10::List<std::optional<at::Tensor>> out;
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(e.isTensor() ? std::optional<at::Tensor>(fn(e.toTensor())) : std::nullopt);
    }
    v = c10::IValue(std::move(out));
  } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
    v = c10::IValue(device);
  }
}

// ---- op_signature.cpp ----------------------------------------------------------------------------------
// What the Meta kernel inferred for one argument signature.
struct Inferred {
  struct Out {
    static constexpr int kNew = -1;        // a new tensor, allocated at launch
    static constexpr int kView = -2;       // a view of an argument
    static constexpr int kUndefined = -3;  // an undefined tensor (a gradient the output_mask left out)
    int arg;  // >= 0: the npu argument (in signature order) written in place; else one of the kinds above
    std::vector<int64_t> sizes, strides;
    c10::ScalarType dtype;
  };
  bool ok = false;         // false: run synchronously
  bool view = false;       // every output is a view of an argument: run at once, no data access
  // What the signature's kernel costs, learnt from its first queued runs on the stream worker (thread CPU time)
  // and its first inline runs on the host: whether it is small and fast enough to run inline on an idle stream,
  // and how long an inline launch queued behind it waits (launch::take_inline). Shared by the copies of one
  // signature's entry; a wrong guess costs only speed.
  struct KernelCost {
    static constexpr int kSamples = 4;
    std::atomic<int> samples{0};
    std::atomic<int64_t> fastest_ns{INT64_MAX};
    bool sampling() const { return samples.load(std::memory_order_relaxed) < kSamples; }
    std::atomic<int64_t> touched{0};  // bytes of arguments and results, as sampled

    // Whether the kernel runs inline on an idle stream (launch.h, inline_kernel_ns): small (at most
    // `max_bytes` touched) and, on the launching thread, faster than `max_ns`. The worker's samples cannot
    // tell: a tiny kernel samples 3-17 us there, its own cost of a kernel, more while the host keeps launching.
    // So a small kernel's first kSamples inline runs are timed on the host, and it stays inline only if the
    // fastest was under `max_ns`.
    std::atomic<int> inline_samples{0};
    std::atomic<int64_t> inline_fastest_ns{INT64_MAX};
    bool runs_inline(int64_t max_bytes, int64_t max_ns) const {
      if (max_ns <= 0 || sampling() || touched.load(std::memory_order_relaxed) > max_bytes) return false;
      return timing_inline() || inline_fastest_ns.load(std::memory_order_relaxed) < max_ns;
    }
    bool timing_inline() const { return inline_samples.load(std::memory_order_relaxed) < kSamples; }
    void add_inline_sample(int64_t ns) {
      int64_t prev = inline_fastest_ns.load(std::memory_order_relaxed);
      while (ns < prev && !inline_fastest_ns.compare_exchange_weak(prev, ns, std::memory_order_relaxed)) {
      }
      inline_samples.fetch_add(1, std::memory_order_relaxed);
    }
    void add_sample(int64_t ns, int64_t bytes) {
      int64_t prev = fastest_ns.load(std::memory_order_relaxed);
      while (ns < prev && !fastest_ns.compare_exchange_weak(prev, ns, std::memory_order_relaxed)) {
      }
      touched.store(bytes, std::memory_order_relaxed);
      samples.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::shared_ptr<KernelCost> kernel_cost = std::make_shared<KernelCost>();
  // Set when every return is a new tensor (no lists) and the op's out= overload may write them directly:
  // a candidate after inference, kept only if the first call's check agreed (fallback.cpp, out_form_agrees).
  std::optional<c10::OperatorHandle> out_op;
  std::vector<Out> outs;   // flattened returns
  std::vector<int64_t> list_sizes;  // per return: -1 for a tensor, else the list's length
};

// The shared "run synchronously" answer.
std::shared_ptr<const Inferred> not_queueable();

// The key of everything a Meta kernel can see of the call's arguments (stack[begin:]), and the npu tensors
// among them in key order. False (not cacheable) for argument kinds it does not encode.
bool signature_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t begin, std::string& key,
                   std::vector<at::Tensor>& npu_args);

// The process-wide cache of inferences by signature key.
std::shared_ptr<const Inferred> find_inferred(const std::string& key);
void store_inferred(const std::string& key, std::shared_ptr<const Inferred> inferred);

// Runs the op's Meta kernel on meta stand-ins of the arguments and describes the outputs. `draws_random`:
// the op takes a generator (its out= form is then no candidate: checking it would draw again).
std::shared_ptr<const Inferred> infer_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                              size_t begin, bool draws_random);

// True on a thread that is running an op's Meta kernel for infer_outputs (its warnings are dropped).
bool in_meta_inference();

// `inferred` if the synchronous run's returns (the last returns of `stack`) are exactly what it predicted,
// else not_queueable().
std::shared_ptr<const Inferred> verify_outputs(const c10::OperatorHandle& op,
                                               const std::shared_ptr<const Inferred>& inferred,
                                               const torch::jit::Stack& stack, const std::vector<at::Tensor>& npu_args);

// ---- fallback.cpp --------------------------------------------------------------------------------------
void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace npudist::op_path
