// Example user extension: an operator with an npu (PrivateUse1) kernel, built with
// torch.utils.cpp_extension and npudist's <npudist/extension.h>. See README.md next to this file.
// Only the headers needed for operator registration (no torch/extension.h, no pybind11): it is loaded as a
// plain library (torch.utils.cpp_extension.load(..., is_python_module=False)), and compiles several times faster.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <npudist/extension.h>

namespace {

// out = x + alpha * y, computed through the npu data pointers under the device guard of x.
at::Tensor scaled_add_npu(const at::Tensor& x, const at::Tensor& y, double alpha) {
  npudist::check_npu(x, "myops::scaled_add", "x");
  npudist::check_npu(y, "myops::scaled_add", "y");
  TORCH_CHECK(x.device() == y.device(), "myops::scaled_add: x and y are on different devices (", x.device(),
              ", ", y.device(), ")");
  TORCH_CHECK(x.sizes() == y.sizes(), "myops::scaled_add: shapes differ: ", x.sizes(), " vs ", y.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat,
              "myops::scaled_add: float32 tensors expected, got ", x.scalar_type(), " and ", y.scalar_type());
  npudist::NPUGuard guard(x.device());
  at::Tensor xc = x.contiguous(), yc = y.contiguous();
  at::Tensor out = at::empty_like(xc);  // npu caching allocator, on x's device
  npudist::waitCurrentNPUStream();       // x, y (and the contiguous copies) may still be queued
  const float* px = xc.data_ptr<float>();
  const float* py = yc.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const float a = static_cast<float>(alpha);
  for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = px[i] + a * py[i];
  return out;
}

// What a kernel sees: (current device inside the guard, current stream id, device of the output allocation).
std::vector<int64_t> probe_npu(const at::Tensor& x) {
  npudist::check_npu(x, "myops::probe", "x");
  npudist::NPUGuard guard(x.device());
  c10::Stream stream = npudist::getCurrentNPUStream();
  at::Tensor tmp = at::empty({1}, x.options());
  return {npudist::current_device(), stream.id(), tmp.device().index()};
}

}  // namespace

TORCH_LIBRARY(myops, m) {
  m.def("scaled_add(Tensor x, Tensor y, float alpha=1.) -> Tensor");
  m.def("probe(Tensor x) -> int[]");
}

TORCH_LIBRARY_IMPL(myops, PrivateUse1, m) {
  m.impl("scaled_add", scaled_add_npu);
  m.impl("probe", probe_npu);
}
