"""RMS and layer norms.

``npu::npu_rms_norm(x, gamma, epsilon=1e-6) -> (y, rstd)``: ``rstd = 1 / sqrt(mean(x^2) + epsilon)`` over the
trailing ``gamma.dim()`` dims of ``x`` (float32), and ``y = x * rstd * gamma`` in x's dtype. ``rstd`` has x's
shape with those dims set to 1 (as Ascend returns it). ``npu_rms_norm_backward(dy, x, gamma, rstd) -> (dx, dgamma)``.
The add (residual) and cast variants, Gemma's ``1 + gamma`` form and the inference layer norm follow below.
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


# ---- add + rms norm ---------------------------------------------------------------------------------------
# npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6) -> (y, rstd, x): the residual add fused with the norm,
# x = x1 + x2 (returned, the next residual) and y, rstd = npu_rms_norm(x, gamma, epsilon).
# npu_add_rms_norm_cast(...) -> (y1, y2, rstd, x): the same with y1 = y cast to float32.
def _add_rms(x1, x2, gamma, epsilon):
    if x1.shape != x2.shape:
        raise ValueError(f"npu_add_rms_norm: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must have one shape")
    dims = _norm_dims(x1, gamma)
    x = x1 + x2
    xf = x.float() if x.dtype != torch.float64 else x
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon).float()
    return (xf * rstd * gamma.to(xf.dtype)).to(x1.dtype), rstd, x


def _add_rms_fake(x1, x2, gamma):
    if x1.shape != x2.shape:
        raise ValueError(f"npu_add_rms_norm: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must have one shape")
    dims = _norm_dims(x1, gamma)
    stat = [1 if i in dims else s for i, s in enumerate(x1.shape)]
    return torch.empty_like(x1), x1.new_empty(stat, dtype=torch.float32), torch.empty_like(x1)


@custom_op("npu::npu_add_rms_norm", mutates_args=(), device_types="npu",
           schema="(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)")
def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    return _add_rms(x1, x2, gamma, epsilon)


@npu_add_rms_norm.register_fake
def _(x1, x2, gamma, epsilon=1e-6):
    return _add_rms_fake(x1, x2, gamma)


def _add_setup(ctx, inputs, output):
    _, _, gamma, _ = inputs
    ctx.save_for_backward(output[2], gamma, output[1])
    # an unused output's gradient stays None (a materialised zeros tensor would be a plain tensor under DTensor)
    ctx.set_materialize_grads(False)


def _add_backward(ctx, dy, _drstd, dx_sum):
    x, gamma, rstd = ctx.saved_tensors
    if dy is None:
        dx, dgamma = torch.zeros_like(x), torch.zeros_like(gamma)
    else:
        dx, dgamma = torch.ops.npu.npu_rms_norm_backward(dy, x, gamma, rstd)
    if dx_sum is not None:
        dx = dx + dx_sum  # x feeds both the norm and the returned residual
    return dx, dx, dgamma, None


register_autograd("npu::npu_add_rms_norm", _add_backward, setup_context=_add_setup)


@custom_op("npu::npu_add_rms_norm_cast", mutates_args=(), device_types="npu",
           schema="(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor, Tensor)")
def npu_add_rms_norm_cast(x1, x2, gamma, epsilon=1e-6):
    y, rstd, x = _add_rms(x1, x2, gamma, epsilon)
    return y.to(torch.float32, copy=True), y, rstd, x


@npu_add_rms_norm_cast.register_fake
def _(x1, x2, gamma, epsilon=1e-6):
    y, rstd, x = _add_rms_fake(x1, x2, gamma)
    return y.float(), y, rstd, x


# ---- Gemma's rms norm -------------------------------------------------------------------------------------
# npu_gemma_rms_norm(self, gamma, epsilon=1e-6) -> (y, rstd): y = x * rstd * (1 + gamma) (Gemma scales by
# 1 + weight); rstd over the trailing gamma.dim() dims, in input's dtype (as documented).
@custom_op("npu::npu_gemma_rms_norm", mutates_args=(), device_types="npu",
           schema="(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)")
def npu_gemma_rms_norm(x, gamma, epsilon=1e-6):
    dims = _norm_dims(x, gamma)
    xf = x.float() if x.dtype != torch.float64 else x
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (xf * rstd * (1 + gamma.to(xf.dtype))).to(x.dtype), rstd.to(x.dtype)


@npu_gemma_rms_norm.register_fake
def _(x, gamma, epsilon=1e-6):
    dims = _norm_dims(x, gamma)
    return torch.empty_like(x), x.new_empty([1 if i in dims else s for i, s in enumerate(x.shape)])


def _gemma_setup(ctx, inputs, output):
    x, gamma, epsilon = inputs
    ctx.save_for_backward(x, gamma)
    ctx.epsilon = epsilon


def _gemma_backward(ctx, dy, _drstd):
    x, gamma = ctx.saved_tensors
    # y = rms_norm(x, 1 + gamma): the rms-norm gradients with the shifted weight (rstd recomputed in float32)
    dims = _norm_dims(x, gamma)
    xf = x.float() if x.dtype != torch.float64 else x
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + ctx.epsilon)
    dx, dgamma = torch.ops.npu.npu_rms_norm_backward(dy, x, 1 + gamma, rstd)
    return dx, dgamma.to(gamma.dtype), None


register_autograd("npu::npu_gemma_rms_norm", _gemma_backward, setup_context=_gemma_setup)


# ---- layer norm (inference) --------------------------------------------------------------------------------
@custom_op("npu::npu_layer_norm_eval", mutates_args=(), device_types="npu", schema=(
    "(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor"))
def npu_layer_norm_eval(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm (documented as the same), computed in float32 for 16-bit inputs."""
    _check_layer_norm(x, normalized_shape, weight, bias)
    up = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    return torch.nn.functional.layer_norm(x.to(up), list(normalized_shape), None if weight is None else weight.to(up),
                                          None if bias is None else bias.to(up), eps).to(x.dtype)


def _check_layer_norm(x, normalized_shape, weight, bias):
    k = len(normalized_shape)
    if k == 0 or k > x.dim() or list(x.shape[x.dim() - k:]) != list(normalized_shape):
        raise ValueError(f"npu_layer_norm_eval: normalized_shape {list(normalized_shape)} must equal the trailing "
                         f"dims of input {tuple(x.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and list(t.shape) != list(normalized_shape):
            raise ValueError(f"npu_layer_norm_eval: {name} {tuple(t.shape)} must have normalized_shape "
                             f"{list(normalized_shape)}")


@npu_layer_norm_eval.register_fake
def _(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    _check_layer_norm(x, normalized_shape, weight, bias)
    return torch.empty_like(x)
