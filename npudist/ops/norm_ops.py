"""Group norm with a fused activation, the batch statistics operators and the speech-feature batch normalization,
each the aten composition its documentation describes (autograd, fake tensors and compile come from the aten ops).

* ``npu_group_norm_silu(input, weight, bias, group, eps=1e-5) -> (out, mean, rstd)``: group norm over dim 1 split
  in ``group`` groups (statistics over each group's channels and all trailing dims, biased variance), the affine
  ``weight``/``bias`` per channel (None: 1 / 0), then ``silu``; ``mean`` and ``rstd`` are (N, group) in input's dtype.
* ``npu_group_norm_swish(input, num_groups, weight, bias, eps=1e-5, swish_scale=1.0)``: the same group norm, then
  ``swish(y) = y * sigmoid(swish_scale * y)``.
* ``batch_norm_reduce(input, eps) -> (sum, square_sum)``: per channel of an (N, C, H, W) input, the sum and the
  sum of squares over N, H, W, float32 (``eps`` is documented as reserved: not used).
* ``npu_normalize_batch(self, seq_len, normalize_type=0)``: for (n, c, d) features with ``seq_len[i]`` valid
  frames, statistics over the first ``seq_len[i]`` frames of item ``i`` -- per channel (0, "per_feature") or
  over all channels (1, "all_features") -- and ``(x - mean) / (std + 1e-5)`` on every frame. ``std`` is the
  unbiased standard deviation: the op's two modes are those of the speech front ends' ``normalize_batch``
  (Jasper/NeMo), whose convention this follows; torch_npu's page documents no formula.
"""
from __future__ import annotations

import torch

_NORMALIZE_EPS = 1e-5


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _group_norm(op, x, weight, bias, groups, eps):
    if x.dim() < 2:
        _fail(op, f"input must have at least 2 dims (N, C, ...), got {x.dim()}-D")
    n, c = x.shape[0], x.shape[1]
    if groups <= 0 or c % groups:
        _fail(op, f"the channel count {c} must be divisible by the group count {groups}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (c,):
            _fail(op, f"{name} must be ({c},), got {tuple(t.shape)}")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    g = x.to(acc).reshape(n, groups, -1)
    mean = g.mean(-1)
    rstd = torch.rsqrt(g.var(-1, unbiased=False) + eps)
    y = ((g - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)).reshape(x.shape)
    channel = [1, c] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * weight.to(acc).view(channel)
    if bias is not None:
        y = y + bias.to(acc).view(channel)
    return y, mean.to(x.dtype), rstd.to(x.dtype)


def npu_group_norm_silu(input, weight, bias, group, eps=1e-5):
    y, mean, rstd = _group_norm("npu_group_norm_silu", input, weight, bias, group, eps)
    return torch.nn.functional.silu(y).to(input.dtype), mean, rstd


def npu_group_norm_swish(input, num_groups, weight, bias, eps=1e-5, swish_scale=1.0):
    eps = 1e-5 if eps is None else eps
    scale = 1.0 if swish_scale is None else swish_scale
    y, mean, rstd = _group_norm("npu_group_norm_swish", input, weight, bias, num_groups, eps)
    return (y * torch.sigmoid(scale * y)).to(input.dtype), mean, rstd


def batch_norm_reduce(input, eps):
    if input.dim() != 4:
        _fail("batch_norm_reduce", f"input must be 4-D (N, C, H, W), got {input.dim()}-D")
    x = input.float()
    return x.sum((0, 2, 3)), (x * x).sum((0, 2, 3))


def npu_normalize_batch(self, seq_len, normalize_type=0):
    op = "npu_normalize_batch"
    if self.dim() != 3:
        _fail(op, f"self must be (n, c, d), got {self.dim()}-D")
    if seq_len.dim() != 1 or seq_len.shape[0] != self.shape[0]:
        _fail(op, f"seq_len must be ({self.shape[0]},), got {tuple(seq_len.shape)}")
    if normalize_type not in (0, 1):
        _fail(op, f"normalize_type must be 0 (per_feature) or 1 (all_features), got {normalize_type}")
    valid = (torch.arange(self.shape[2], device=self.device) < seq_len.unsqueeze(-1)).unsqueeze(1)  # (n, 1, d)
    valid = valid.to(self.dtype).expand(self.shape)
    dims = (2,) if normalize_type == 0 else (1, 2)
    count = valid.sum(dims, keepdim=True)
    mean = (self * valid).sum(dims, keepdim=True) / count
    var = (((self - mean) * valid) ** 2).sum(dims, keepdim=True) / (count - 1)
    return (self - mean) / (var.sqrt() + _NORMALIZE_EPS)


_lib = torch.library.Library("npu", "FRAGMENT")
for _schema, _fn in (
        ("npu_group_norm_silu(Tensor input, Tensor? weight, Tensor? bias, int group, float eps=0.00001) "
         "-> (Tensor, Tensor, Tensor)", npu_group_norm_silu),
        ("npu_group_norm_swish(Tensor input, int num_groups, Tensor weight, Tensor bias, float? eps=1e-5, "
         "float? swish_scale=1.0) -> (Tensor, Tensor, Tensor)", npu_group_norm_swish),
        ("batch_norm_reduce(Tensor input, float eps) -> (Tensor, Tensor)", batch_norm_reduce),
        ("npu_normalize_batch(Tensor self, Tensor seq_len, int normalize_type=0) -> Tensor", npu_normalize_batch)):
    _lib.define(_schema)
    _lib.impl(_schema.split("(", 1)[0], _fn, "CompositeImplicitAutograd")
