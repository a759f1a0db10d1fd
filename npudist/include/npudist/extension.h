// npudist C++ extension API: write PrivateUse1 (npu) kernels for your own operators.
//
//   #include <torch/extension.h>
//   #include <npudist/extension.h>
//   at::Tensor my_op_npu(const at::Tensor& x) {
//     npudist::check_npu(x, "my_op", "x");
//     npudist::NPUGuard guard(x.device());          // current npu device = x's, restored on exit
//     c10::Stream stream = npudist::getCurrentNPUStream();
//     at::Tensor out = at::empty_like(x);           // allocated (and counted) by the npu caching allocator
//     npudist::waitCurrentNPUStream();              // ops launch asynchronously: let x's producers finish
//     ... read x.data_ptr<float>(), write out.data_ptr<float>() ...
//     return out;
//   }
//   TORCH_LIBRARY(myops, m) { m.def("my_op(Tensor x) -> Tensor"); }
//   TORCH_LIBRARY_IMPL(myops, PrivateUse1, m) { m.impl("my_op", my_op_npu); }
//
// Build with torch.utils.cpp_extension (load / CppExtension) adding npudist.cpp_extension.include_paths();
// import npudist before loading the extension (it registers the npu device). Names follow torch_npu's
// c10_npu::NPUGuard / getCurrentNPUStream so Ascend extension code ports with a namespace change.
//
// Emulation note: npu memory is host memory, so a kernel computes on the calling thread directly through the
// data pointers. npu ops launch asynchronously (their kernels run later on the stream's worker; see
// docs/device.md, "Asynchronous launch"), so a host-computing kernel calls waitCurrentNPUStream() before it
// touches the bytes, as host code reading CUDA memory synchronizes first.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

namespace npudist {

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;

// Raise a Python-visible error naming the op and the argument unless `t` is a defined npu tensor.
inline void check_npu(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.defined(), op, ": ", arg, " is undefined");
  TORCH_CHECK(t.device().type() == kNPU, op, ": ", arg, " must be an npu tensor, got one on ", t.device());
}

// Makes `device` the current npu device for its scope (restores the previous one on exit).
class NPUGuard {
 public:
  explicit NPUGuard(c10::Device device) : guard_(checked(device)) {}
  explicit NPUGuard(c10::DeviceIndex index) : guard_(c10::Device(kNPU, index)) {}
  c10::Device current_device() const { return guard_.current_device(); }
  c10::Device original_device() const { return guard_.original_device(); }

 private:
  static c10::Device checked(c10::Device d) {
    TORCH_CHECK(d.type() == kNPU, "NPUGuard: expected an npu device, got ", d);
    return d;
  }
  c10::DeviceGuard guard_;
};

// The calling thread's current npu device index.
inline c10::DeviceIndex current_device() {
  return c10::impl::VirtualGuardImpl(kNPU).getDevice().index();
}

// The calling thread's current stream on `index` (default: the current device); what
// torch.npu.current_stream() returns in Python (same stream id).
inline c10::Stream getCurrentNPUStream(c10::DeviceIndex index = -1) {
  c10::impl::VirtualGuardImpl impl(kNPU);
  if (index < 0) index = impl.getDevice().index();
  return impl.getStream(c10::Device(kNPU, index));
}

// Block until the work queued on the current stream of `index` (default: the current device) has run, and
// raise an error of a queued kernel, so that a kernel computing on the host sees its inputs' final bytes.
inline void waitCurrentNPUStream(c10::DeviceIndex index = -1) {
  c10::impl::VirtualGuardImpl(kNPU).synchronizeStream(getCurrentNPUStream(index));
}

}  // namespace npudist
