"""``npu::npu_rms_norm(x, gamma, epsilon=1e-6) -> (y, rstd)``.

``rstd = 1 / sqrt(mean(x^2) + epsilon)`` over the trailing ``gamma.dim()`` dims of ``x`` (float32), and
``y = x * rstd * gamma`` in x's dtype. ``rstd`` has x's shape with those dims set to 1 (as Ascend returns it).
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd


def _norm_dims(x: torch.Tensor, gamma: torch.Tensor) -> tuple[int, ...]:
    k = gamma.dim()
    if k == 0 or k > x.dim() or tuple(x.shape[x.dim() - k:]) != tuple(gamma.shape):
        raise ValueError(f"npu_rms_norm: gamma's shape {tuple(gamma.shape)} must equal the trailing dims of "
                         f"x's shape {tuple(x.shape)}")
    return tuple(range(x.dim() - k, x.dim()))


@custom_op("npu::npu_rms_norm", mutates_args=(), device_types="npu",
           schema="(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)")
def npu_rms_norm(x, gamma, epsilon=1e-6):
    dims = _norm_dims(x, gamma)
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


@npu_rms_norm.register_fake
def _(x, gamma, epsilon=1e-6):
    dims = _norm_dims(x, gamma)
    stat = [1 if i in dims else s for i, s in enumerate(x.shape)]
    return torch.empty_like(x), x.new_empty(stat, dtype=torch.float32)


@custom_op("npu::npu_rms_norm_backward", mutates_args=(), device_types="npu",
           schema="(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, Tensor)")
def npu_rms_norm_backward(dy, x, gamma, rstd):
    dims = _norm_dims(x, gamma)
    xf, gf, dyf = x.float(), gamma.float(), dy.float()
    xhat = xf * rstd
    dxhat = dyf * gf
    # d/dx of x * rstd(x): rstd * (dxhat - xhat * mean(dxhat * xhat)) over the normalised dims
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(dim=dims, keepdim=True))
    batch = tuple(range(x.dim() - len(dims)))
    dgamma = (dyf * xhat).sum(dim=batch) if batch else dyf * xhat
    return dx.to(x.dtype), dgamma.to(gamma.dtype)


@npu_rms_norm_backward.register_fake
def _(dy, x, gamma, rstd):
    return torch.empty_like(x), torch.empty_like(gamma)


def _setup(ctx, inputs, output):
    x, gamma, _ = inputs
    ctx.save_for_backward(x, gamma, output[1])


def _backward(ctx, dy, _drstd):
    x, gamma, rstd = ctx.saved_tensors
    dx, dgamma = torch.ops.npu.npu_rms_norm_backward(dy, x, gamma, rstd)
    return dx, dgamma, None


register_autograd("npu::npu_rms_norm", _backward, setup_context=_setup)
