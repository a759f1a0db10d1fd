"""Gated activations and the scaled masked softmax.

* ``npu::npu_swiglu(x, dim=-1)``: ``a, b = x.chunk(2, dim)``; ``silu(a) * b``.
* ``npu::npu_geglu(x, dim=-1, approximate=1) -> (out, gelu_out)``: ``a, b = x.chunk(2, dim)``;
  ``gelu_out = gelu(b)`` (approximate 1 = tanh, 0 = erf), ``out = a * gelu_out`` (Ascend's default
  activate-right form, which diffusers' GEGLU relies on).
* ``npu::npu_scaled_masked_softmax(x, mask, scale=1.0, fixed_triu_mask=False)``: softmax over the last dim of
  ``x * scale`` with ``mask`` True positions filled with -10000 (Ascend's fill value); ``fixed_triu_mask`` uses
  ``triu(ones, 1)`` over the last two dims instead of ``mask``. Computed in float32, returned in x's dtype.
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

_MASK_FILL = -10000.0


def _halves(x: torch.Tensor, dim: int, op: str) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() == 0 or not -x.dim() <= dim < x.dim():
        raise ValueError(f"{op}: dim {dim} is out of range for a {x.dim()}-D input")
    if x.shape[dim] % 2:
        raise ValueError(f"{op}: input size {x.shape[dim]} along dim {dim} must be even (it is split in halves)")
    return x.chunk(2, dim=dim)


def _half_shape(x: torch.Tensor, dim: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] //= 2
    return shape


# ---- swiglu -------------------------------------------------------------------------------------------
@custom_op("npu::npu_swiglu", mutates_args=(), device_types="npu", schema="(Tensor self, int dim=-1) -> Tensor")
def npu_swiglu(x, dim=-1):
    a, b = _halves(x, dim, "npu_swiglu")
    return (torch.nn.functional.silu(a.float()) * b.float()).to(x.dtype)


@npu_swiglu.register_fake
def _(x, dim=-1):
    _halves(x, dim, "npu_swiglu")
    return x.new_empty(_half_shape(x, dim))


@custom_op("npu::npu_swiglu_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad_output, Tensor self, int dim=-1) -> Tensor")
def npu_swiglu_backward(grad, x, dim=-1):
    a, b = (t.float() for t in _halves(x, dim, "npu_swiglu_backward"))
    g = grad.float()
    sig = torch.sigmoid(a)
    da = g * b * sig * (1 + a * (1 - sig))  # d silu(a)/da = sig * (1 + a * (1 - sig))
    db = g * a * sig
    return torch.cat((da, db), dim=dim).to(x.dtype)


@npu_swiglu_backward.register_fake
def _(grad, x, dim=-1):
    return torch.empty_like(x)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.dim = inputs[1]


def _swiglu_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return torch.ops.npu.npu_swiglu_backward(grad, x, ctx.dim), None


register_autograd("npu::npu_swiglu", _swiglu_backward, setup_context=_swiglu_setup)


# ---- geglu --------------------------------------------------------------------------------------------
def _approximate(approximate: int) -> str:
    if approximate not in (0, 1):
        raise ValueError(f"npu_geglu: approximate must be 0 (erf) or 1 (tanh), got {approximate}")
    return "tanh" if approximate == 1 else "none"


@custom_op("npu::npu_geglu", mutates_args=(), device_types="npu",
           schema="(Tensor self, int dim=-1, int approximate=1) -> (Tensor, Tensor)")
def npu_geglu(x, dim=-1, approximate=1):
    a, b = _halves(x, dim, "npu_geglu")
    gelu_b = torch.nn.functional.gelu(b.float(), approximate=_approximate(approximate))
    return (a.float() * gelu_b).to(x.dtype), gelu_b.to(x.dtype)


@npu_geglu.register_fake
def _(x, dim=-1, approximate=1):
    _halves(x, dim, "npu_geglu")
    _approximate(approximate)
    return x.new_empty(_half_shape(x, dim)), x.new_empty(_half_shape(x, dim))


@custom_op("npu::npu_geglu_grad", mutates_args=(), device_types="npu",
           schema="(Tensor grad_output, Tensor grad_gelu, Tensor self, int dim=-1, int approximate=1) -> Tensor")
def npu_geglu_grad(grad_out, grad_gelu, x, dim=-1, approximate=1):
    a, b = (t.float() for t in _halves(x, dim, "npu_geglu_grad"))
    mode = _approximate(approximate)
    gelu_b = torch.nn.functional.gelu(b, approximate=mode)
    g = grad_out.float()
    da = g * gelu_b
    # out = a * gelu(b) and gelu_out = gelu(b) both depend on b through gelu(b)
    dgelu = g * a + grad_gelu.float()
    db = torch.ops.aten.gelu_backward(dgelu, b, approximate=mode)
    return torch.cat((da, db), dim=dim).to(x.dtype)


@npu_geglu_grad.register_fake
def _(grad_out, grad_gelu, x, dim=-1, approximate=1):
    return torch.empty_like(x)


def _geglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.dim, ctx.approximate = inputs[1], inputs[2]


def _geglu_backward(ctx, grad_out, grad_gelu):
    (x,) = ctx.saved_tensors
    half = _half_shape(x, ctx.dim)
    grad_out = grad_out if grad_out is not None else x.new_zeros(half)
    grad_gelu = grad_gelu if grad_gelu is not None else x.new_zeros(half)
    return torch.ops.npu.npu_geglu_grad(grad_out, grad_gelu, x, ctx.dim, ctx.approximate), None, None


register_autograd("npu::npu_geglu", _geglu_backward, setup_context=_geglu_setup)


# ---- scaled masked softmax ----------------------------------------------------------------------------
def _softmax_mask(x: torch.Tensor, mask: torch.Tensor, fixed_triu_mask: bool) -> torch.Tensor:
    if fixed_triu_mask:
        if x.dim() < 2:
            raise ValueError("npu_scaled_masked_softmax: fixed_triu_mask needs an input of at least 2 dims")
        return torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).triu(1)
    if mask.dtype != torch.bool:
        raise ValueError(f"npu_scaled_masked_softmax: mask must be bool (True = masked out), got {mask.dtype}")
    try:
        if torch.broadcast_shapes(mask.shape, x.shape) != x.shape:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"npu_scaled_masked_softmax: mask of shape {tuple(mask.shape)} must broadcast to x's "
                         f"shape {tuple(x.shape)}") from None
    return mask


@custom_op("npu::npu_scaled_masked_softmax", mutates_args=(), device_types="npu",
           schema="(Tensor x, Tensor mask, float scale=1., bool fixed_triu_mask=False) -> Tensor")
def npu_scaled_masked_softmax(x, mask, scale=1.0, fixed_triu_mask=False):
    m = _softmax_mask(x, mask, fixed_triu_mask)
    return torch.softmax((x.float() * scale).masked_fill(m, _MASK_FILL), dim=-1).to(x.dtype)


@npu_scaled_masked_softmax.register_fake
def _(x, mask, scale=1.0, fixed_triu_mask=False):
    _softmax_mask(x, mask, fixed_triu_mask)
    return torch.empty_like(x)


@custom_op("npu::npu_scaled_masked_softmax_backward", mutates_args=(), device_types="npu",
           schema="(Tensor y_grad, Tensor y, Tensor mask, float scale, bool fixed_triu_mask) -> Tensor")
def npu_scaled_masked_softmax_backward(y_grad, y, mask, scale, fixed_triu_mask):
    m = _softmax_mask(y, mask, fixed_triu_mask)
    yf, gf = y.float(), y_grad.float()
    dz = yf * (gf - (gf * yf).sum(dim=-1, keepdim=True))
    return (dz.masked_fill(m, 0.0) * scale).to(y.dtype)  # filled positions do not depend on x


@npu_scaled_masked_softmax_backward.register_fake
def _(y_grad, y, mask, scale, fixed_triu_mask):
    return torch.empty_like(y)


def _sms_setup(ctx, inputs, output):
    _, mask, scale, fixed = inputs
    ctx.save_for_backward(output, mask)
    ctx.scale, ctx.fixed = scale, fixed


def _sms_backward(ctx, grad):
    y, mask = ctx.saved_tensors
    return torch.ops.npu.npu_scaled_masked_softmax_backward(grad, y, mask, ctx.scale, ctx.fixed), None, None, None


register_autograd("npu::npu_scaled_masked_softmax", _sms_backward, setup_context=_sms_setup)
