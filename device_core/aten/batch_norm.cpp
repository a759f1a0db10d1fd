// The per-channel statistics kernels nn.SyncBatchNorm calls on a non-CPU device. PyTorch has them only
// for CUDA; here they compute the same math with aten ops on the npu tensors (each of which runs its
// CPU kernel zero-copy through the fallback). Statistics are computed in the accumulate type (float for
// half/bfloat16 inputs, as CUDA does) and the channel is dimension 1.
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include "npu_tensor.h"

namespace npudist {
namespace {

at::ScalarType acc_type(const at::Tensor& t) {
  at::ScalarType s = t.scalar_type();
  return (s == at::kHalf || s == at::kBFloat16) ? at::kFloat : s;
}

// Every dimension but the channel dimension (1).
std::vector<int64_t> reduce_dims(const at::Tensor& input) {
  TORCH_CHECK_VALUE(input.dim() >= 2, "batch norm: expected an input with at least 2 dimensions (N, C, ...), got ",
                    input.sizes());
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector [C] shaped to broadcast against `input` ([1, C, 1, ...]).
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return v.reshape(shape);
}

// Biased per-channel mean and 1 / sqrt(var + eps).
std::tuple<at::Tensor, at::Tensor> stats(const at::Tensor& input, double eps) {
  auto [var, mean] = at::var_mean(input.to(acc_type(input)), reduce_dims(input), /*correction=*/0);
  return {mean, (var + eps).rsqrt()};
}

// Combines per-rank statistics: `mean`/`invstd` are [world, C], `counts` the element count per channel
// on each rank. Global biased variance = sum_i n_i (var_i + (mean_i - mean)^2) / N; running stats are
// updated with the unbiased variance, as in batch_norm's training mode.
std::tuple<at::Tensor, at::Tensor> gather_stats_with_counts(const at::Tensor& input, const at::Tensor& mean,
                                                            const at::Tensor& invstd,
                                                            const std::optional<at::Tensor>& running_mean,
                                                            const std::optional<at::Tensor>& running_var,
                                                            double momentum, double eps, const at::Tensor& counts) {
  TORCH_CHECK_VALUE(mean.dim() == 2 && invstd.sizes() == mean.sizes(),
                    "batch_norm_gather_stats_with_counts: expected mean and invstd of shape [world, C], got ",
                    mean.sizes(), " and ", invstd.sizes());
  TORCH_CHECK_VALUE(counts.numel() == mean.size(0), "batch_norm_gather_stats_with_counts: ", counts.numel(),
                    " counts for ", mean.size(0), " sets of statistics");
  at::ScalarType acc = acc_type(mean);
  at::Tensor n = counts.to(acc).reshape({-1, 1});
  at::Tensor m = mean.to(acc);
  // A rank without elements (count 0) contributes nothing, whatever its invstd holds.
  at::Tensor var = at::where(n > 0, invstd.to(acc).pow(-2) - eps, at::zeros_like(m));
  at::Tensor total = n.sum();
  at::Tensor global_mean = (m * n).sum(0) / total;
  at::Tensor global_var = (n * (var + (m - global_mean).pow(2))).sum(0) / total;
  if (running_mean.has_value() && running_mean->defined()) {
    running_mean->mul_(1 - momentum).add_((global_mean * momentum).to(running_mean->scalar_type()));
  }
  if (running_var.has_value() && running_var->defined()) {
    at::Tensor unbiased = global_var * total / (total - 1);
    running_var->mul_(1 - momentum).add_((unbiased * momentum).to(running_var->scalar_type()));
  }
  return {global_mean.to(mean.scalar_type()), (global_var + eps).rsqrt().to(mean.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor> gather_stats(const at::Tensor& input, const at::Tensor& mean,
                                                const at::Tensor& invstd,
                                                const std::optional<at::Tensor>& running_mean,
                                                const std::optional<at::Tensor>& running_var, double momentum,
                                                double eps, int64_t count) {
  at::Tensor counts = at::full({mean.size(0)}, static_cast<double>(count), mean.options());
  return gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts);
}

// (input - mean) * invstd * weight + bias, per channel; the result has input's dtype and layout.
at::Tensor elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                            double eps) {
  at::ScalarType acc = acc_type(input);
  at::Tensor scale = invstd.to(acc);
  if (weight.has_value() && weight->defined()) scale = scale * weight->to(acc);
  at::Tensor out = (input.to(acc) - per_channel(mean.to(acc), input)) * per_channel(scale, input);
  if (bias.has_value() && bias->defined()) out = out + per_channel(bias->to(acc), input);
  return out.to(input.scalar_type());
}

at::Tensor& elemt_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                 const at::Tensor& invstd, double eps, at::Tensor& out) {
  at::Tensor r = elemt(input, weight, bias, mean, invstd, eps);
  at::native::resize_output(out, r.sizes());
  out.copy_(r);
  return out;
}

// Local sums for the backward pass: sum(dy) and sum(dy * (x - mean)) per channel (when the input needs a
// gradient), and the weight/bias gradients these give.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  at::ScalarType acc = acc_type(input);
  std::vector<int64_t> dims = reduce_dims(input);
  at::Tensor dy = grad_out.to(acc);
  at::Tensor sum_dy = dy.sum(dims);
  at::Tensor sum_dy_xmu = (dy * (input.to(acc) - per_channel(mean.to(acc), input))).sum(dims);
  at::ScalarType param = (weight.has_value() && weight->defined()) ? weight->scalar_type() : input.scalar_type();
  at::Tensor grad_weight = weight_g ? (sum_dy_xmu * invstd.to(acc)).to(param) : at::Tensor();
  at::Tensor grad_bias = bias_g ? sum_dy.to(param) : at::Tensor();
  if (!input_g) return {at::Tensor(), at::Tensor(), grad_weight, grad_bias};
  return {sum_dy.to(mean.scalar_type()), sum_dy_xmu.to(mean.scalar_type()), grad_weight, grad_bias};
}

// dx = (dy - sum_dy / N - (x - mean) * invstd^2 * sum_dy_xmu / N) * invstd * weight, N = sum(count)
// over ranks; sum_dy and sum_dy_xmu are already summed over ranks.
at::Tensor backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                          const at::Tensor& invstd, const std::optional<at::Tensor>& weight, const at::Tensor& sum_dy,
                          const at::Tensor& sum_dy_xmu, const at::Tensor& count) {
  at::ScalarType acc = acc_type(input);
  at::Tensor total = count.to(acc).sum();
  at::Tensor istd = invstd.to(acc);
  at::Tensor scale = istd;
  if (weight.has_value() && weight->defined()) scale = scale * weight->to(acc);
  at::Tensor mean_dy = per_channel(sum_dy.to(acc) / total, input);
  at::Tensor mean_dy_xmu = per_channel(sum_dy_xmu.to(acc) / total, input);
  at::Tensor xmu = input.to(acc) - per_channel(mean.to(acc), input);
  at::Tensor gi = (grad_out.to(acc) - mean_dy - xmu * per_channel(istd * istd, input) * mean_dy_xmu) *
                  per_channel(scale, input);
  return gi.to(input.scalar_type());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", TORCH_FN(stats));
  m.impl("batch_norm_gather_stats", TORCH_FN(gather_stats));
  m.impl("batch_norm_gather_stats_with_counts", TORCH_FN(gather_stats_with_counts));
  m.impl("batch_norm_elemt", TORCH_FN(elemt));
  m.impl("batch_norm_elemt.out", TORCH_FN(elemt_out));
  m.impl("batch_norm_backward_reduce", TORCH_FN(backward_reduce));
  m.impl("batch_norm_backward_elemt", TORCH_FN(backward_elemt));
}

}  // namespace
}  // namespace npudist
