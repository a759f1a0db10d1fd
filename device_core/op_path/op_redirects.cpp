// The op path (op_path.h): aten ops that take the npu fallback although they have other kernels.
#include <torch/library.h>

#include <memory>
#include <string>

#include "npu_tensor.h"
#include "op_path/op_path.h"

namespace npudist {

// Ops with both a CPU kernel and a CompositeExplicitAutograd kernel (e.g. native_layer_norm, whose
// composite kernel is a decomposition for backends without their own) would run the decomposition on
// npu and differ numerically from CPU. Route them to the CPU kernel through the fallback instead, so
// npu results are bitwise identical to CPU. Runs once, after libtorch registered its operators.
namespace {
// Whether the functional op `name` (its default overload) takes the fallback's CPU kernel on npu: it has a
// CPU kernel and no npu kernel of its own.
bool functional_runs_cpu_kernel(c10::Dispatcher& dispatcher, const std::string& name) {
  auto functional = dispatcher.findOp(c10::OperatorName(name, ""));
  return functional && functional->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
         !functional->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
}
}  // namespace

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
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&op_path::npu_fallback>());
      ++n;
    }
  }
  // Ops that write an argument and have only a CompositeExplicitAutograd kernel:
  // - in-place ones (conj_physical_, logical_not_, the _foreach_*_ family, ...): some of those kernels call a
  //   CPU DispatchStub directly, which on an npu tensor fails with "DispatchStub: missing kernel for npu";
  // - out= ones whose functional form runs its CPU kernel through the fallback (mode.values, median.out,
  //   roll.out, ...): some check the device first ("mode only supports CPU, CUDA and MPS"), and either way
  //   the out= form should compute what the functional form computes on npu: CPU's kernel.
  // Run them as one CPU kernel on the aliases instead, like every other op (one queued kernel for a whole
  // _foreach_ list, too). Not the in-place view ops (squeeze_, t_, ...: metadata only, their composite
  // kernels are right on npu), nor copy_ (npu's own copy path) and index_put_ (its _index_put_impl_ is
  // redirected above), nor an out= form whose functional op has an npu kernel of its own (native_dropout:
  // its composite out= kernel calls that npu kernel).
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0 || name.name == "aten::copy_" || name.name == "aten::index_put_") continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema() || op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) || op->hasTag(at::Tag::inplace_view)) {
      continue;
    }
    const auto& args = op->schema().arguments();
    const bool in_place = name.name.back() == '_' && !args.empty() && args[0].alias_info() &&
                          args[0].alias_info()->isWrite();
    bool writes_out = false;
    for (const c10::Argument& a : args) writes_out |= a.kwarg_only() && a.alias_info() && a.alias_info()->isWrite();
    if (!in_place && !(writes_out && functional_runs_cpu_kernel(dispatcher, name.name))) continue;
    std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&op_path::npu_fallback>());
    ++n;
  }
  // Composite ops that choose a backend by device: on PrivateUse1, _convolution and convolution_backward
  // pick ConvBackend::Overrideable (convolution_overrideable, which nobody implements). Running their
  // composite kernel on the CPU aliases makes the choice CPU's (mkldnn / slow / depthwise kernels), so
  // npu convolutions are CPU's convolutions, bit for bit, on the same bytes.
  for (const char* composite : {"convolution", "_convolution", "_convolution.deprecated", "convolution_backward"}) {
    lib->impl(composite, torch::CppFunction::makeFromBoxedFunction<&op_path::npu_fallback>());
    ++n;
  }
  return n;
}
}  // namespace npudist
