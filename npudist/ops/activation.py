"""Gated activations and the scaled masked softmax.

* ``npu::npu_swiglu(x, dim=-1)``: ``a, b = x.chunk(2, dim)``; ``silu(a) * b``.
* ``npu::npu_geglu(x, dim=-1, approximate=1) -> (out, gelu_out)``: ``a, b = x.chunk(2, dim)``;
  ``gelu_out = gelu(b)`` (approximate 1 = tanh, 0 = erf), ``out = a * gelu_out`` (Ascend's default
  activate-right form, which diffusers' GEGLU relies on).
* ``npu::npu_scaled_masked_softmax(x, mask, scale=1.0, fixed_triu_mask=False)``: softmax over the last dim of
  ``x * scale`` with ``mask`` True positions filled with -10000 (Ascend's fill value); ``fixed_triu_mask`` uses
  ``triu(ones, 1)`` over the last two dims instead of ``mask``. Computed in float32, returned in x's dtype.
* ``npu_fast_gelu`` (``x * sigmoid(1.702 x)``), ``npu_silu``, ``npu_mish``, ``npu_gelu_mul`` and
  ``npu_clipped_swiglu``: their documented formulas, next to each below.
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


# ---- elementwise activations --------------------------------------------------------------------------------
def _up(x: torch.Tensor) -> torch.Tensor:
    """16-bit inputs are computed in float32; float32/float64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


_FAST_GELU_ALPHA = 1.702


# npu_fast_gelu(x) = x / (1 + exp(-1.702 x)) = x * sigmoid(1.702 x) (the documented formula of the A2/A3 parts;
# the older parts' formula is the same function written to avoid overflow).
@custom_op("npu::npu_fast_gelu", mutates_args=(), device_types="npu", schema="(Tensor self) -> Tensor")
def npu_fast_gelu(x):
    xf = _up(x)
    return (xf * torch.sigmoid(_FAST_GELU_ALPHA * xf)).to(x.dtype)


@npu_fast_gelu.register_fake
def _(x):
    return torch.empty_like(x)


@custom_op("npu::npu_fast_gelu_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad, Tensor self) -> Tensor")
def npu_fast_gelu_backward(grad, x):
    xf = _up(x)
    s = torch.sigmoid(_FAST_GELU_ALPHA * xf)
    return (_up(grad) * (s + _FAST_GELU_ALPHA * xf * s * (1 - s))).to(x.dtype)


@npu_fast_gelu_backward.register_fake
def _(grad, x):
    return torch.empty_like(x)


def _save_input(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


register_autograd("npu::npu_fast_gelu",
                  lambda ctx, g: torch.ops.npu.npu_fast_gelu_backward(g, ctx.saved_tensors[0]),
                  setup_context=_save_input)


# npu_silu(x) = x * sigmoid(x); npu_mish(x) = x * tanh(softplus(x)), softplus(x) = ln(1 + e^x).
@custom_op("npu::npu_silu", mutates_args=(), device_types="npu", schema="(Tensor self) -> Tensor")
def npu_silu(x):
    xf = _up(x)
    return (xf * torch.sigmoid(xf)).to(x.dtype)


@npu_silu.register_fake
def _(x):
    return torch.empty_like(x)


@custom_op("npu::npu_silu_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad_output, Tensor x0, Tensor x1) -> Tensor")
def npu_silu_backward(grad, x, _out):
    xf = _up(x)
    s = torch.sigmoid(xf)
    return (_up(grad) * s * (1 + xf * (1 - s))).to(x.dtype)


@npu_silu_backward.register_fake
def _(grad, x, out):
    return torch.empty_like(x)


def _silu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output)


register_autograd("npu::npu_silu", lambda ctx, g: torch.ops.npu.npu_silu_backward(g, *ctx.saved_tensors),
                  setup_context=_silu_setup)


@custom_op("npu::npu_mish", mutates_args=(), device_types="npu", schema="(Tensor self) -> Tensor")
def npu_mish(x):
    xf = _up(x)
    return (xf * torch.tanh(torch.nn.functional.softplus(xf))).to(x.dtype)


@npu_mish.register_fake
def _(x):
    return torch.empty_like(x)


@custom_op("npu::npu_mish_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad, Tensor input) -> Tensor")
def npu_mish_backward(grad, x):
    xf = _up(x)
    t = torch.tanh(torch.nn.functional.softplus(xf))
    # d/dx x tanh(sp(x)) = tanh(sp) + x (1 - tanh(sp)^2) sigmoid(x)
    return (_up(grad) * (t + xf * (1 - t * t) * torch.sigmoid(xf))).to(x.dtype)


@npu_mish_backward.register_fake
def _(grad, x):
    return torch.empty_like(x)


register_autograd("npu::npu_mish", lambda ctx, g: torch.ops.npu.npu_mish_backward(g, ctx.saved_tensors[0]),
                  setup_context=_save_input)


# ---- gelu_mul: gelu(x1) * x2 over the halves of the last dim ----------------------------------------------------
def _gelu_mode(approximate: str) -> str:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"npu_gelu_mul: approximate must be 'none' (erf) or 'tanh', got {approximate!r}")
    return approximate


@custom_op("npu::npu_gelu_mul", mutates_args=(), device_types="npu",
           schema="(Tensor input, *, str approximate='none') -> Tensor")
def npu_gelu_mul(x, *, approximate="none"):
    a, b = (_up(t) for t in _halves(x, -1, "npu_gelu_mul"))
    return (torch.nn.functional.gelu(a, approximate=_gelu_mode(approximate)) * b).to(x.dtype)


@npu_gelu_mul.register_fake
def _(x, *, approximate="none"):
    _halves(x, -1, "npu_gelu_mul")
    _gelu_mode(approximate)
    return x.new_empty(_half_shape(x, -1))


@custom_op("npu::_gelu_mul_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad, Tensor input, str approximate) -> Tensor")
def _gelu_mul_backward(grad, x, approximate):
    a, b = (_up(t) for t in _halves(x, -1, "npu_gelu_mul"))
    g = _up(grad)
    da = torch.ops.aten.gelu_backward(g * b, a, approximate=approximate)
    db = g * torch.nn.functional.gelu(a, approximate=approximate)
    return torch.cat((da, db), dim=-1).to(x.dtype)


@_gelu_mul_backward.register_fake
def _(grad, x, approximate):
    return torch.empty_like(x)


def _gelu_mul_setup(ctx, inputs, keyword_only_inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.approximate = keyword_only_inputs.get("approximate", "none")


register_autograd("npu::npu_gelu_mul",
                  lambda ctx, g: torch.ops.npu._gelu_mul_backward(g, ctx.saved_tensors[0], ctx.approximate),
                  setup_context=_gelu_mul_setup)


# ---- clipped swiglu --------------------------------------------------------------------------------------------
# npu_clipped_swiglu(x, *, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True):
# x viewed as [pre, cut * after] around dim; with group_index only the first sum(group_index) pre-rows are
# computed (the rest of the output is 0); A, B = the (even, odd) or (front, back) halves of each row;
# A = min(A, limit), B = clamp(B, -limit, limit); y = A * sigmoid(alpha * A) * (B + bias).
def _clip_plan(x, dim):
    if x.dim() < 2 or not -x.dim() <= dim < x.dim():
        raise ValueError(f"npu_clipped_swiglu: x must have more than 1 dim and dim in range, got {x.dim()}-D, "
                         f"dim {dim}")
    d = dim % x.dim()
    if x.shape[d] % 2:
        raise ValueError(f"npu_clipped_swiglu: size {x.shape[d]} of dim {dim} must be even")
    pre = 1
    for s in x.shape[:d]:
        pre *= s
    out_shape = list(x.shape)
    out_shape[d] //= 2
    return d, pre, out_shape


def _clip_halves(x2d, interleaved):
    if interleaved:
        return x2d[:, 0::2], x2d[:, 1::2]
    h = x2d.shape[1] // 2
    return x2d[:, :h], x2d[:, h:]


def _clip_rows(x, group_index, pre):
    if group_index is None:
        return pre
    rows = int(group_index.sum())
    if rows > pre or bool((group_index < 0).any()):
        raise ValueError(f"npu_clipped_swiglu: group_index must be non-negative and sum to at most {pre} rows, "
                         f"got sum {rows}")
    return rows


def _clip_interleave_back(da, db, interleaved):
    if interleaved:
        return torch.stack((da, db), dim=-1).flatten(-2)
    return torch.cat((da, db), dim=-1)


@custom_op("npu::_clipped_swiglu", mutates_args=(), device_types="npu", schema=(
    "(Tensor x, Tensor? group_index, int dim, float alpha, float limit, float bias, bool interleaved) -> Tensor"))
def _clipped_swiglu(x, group_index, dim, alpha, limit, bias, interleaved):
    d, pre, out_shape = _clip_plan(x, dim)
    rows = _clip_rows(x, group_index, pre)
    a, b = _clip_halves(_up(x).reshape(pre, -1)[:rows], interleaved)
    a, b = a.clamp(max=limit), b.clamp(-limit, limit)
    y = torch.zeros(pre, a.shape[1], dtype=a.dtype, device=x.device)
    y[:rows] = a * torch.sigmoid(alpha * a) * (b + bias)
    return y.reshape(out_shape).to(x.dtype)


@_clipped_swiglu.register_fake
def _(x, group_index, dim, alpha, limit, bias, interleaved):
    _, _, out_shape = _clip_plan(x, dim)
    return x.new_empty(out_shape)


@custom_op("npu::_clipped_swiglu_backward", mutates_args=(), device_types="npu", schema=(
    "(Tensor grad, Tensor x, Tensor? group_index, int dim, float alpha, float limit, float bias, bool interleaved)"
    " -> Tensor"))
def _clipped_swiglu_backward(grad, x, group_index, dim, alpha, limit, bias, interleaved):
    d, pre, _ = _clip_plan(x, dim)
    rows = _clip_rows(x, group_index, pre)
    a0, b0 = _clip_halves(_up(x).reshape(pre, -1)[:rows], interleaved)
    g = _up(grad).reshape(pre, -1)[:rows]
    a, b = a0.clamp(max=limit), b0.clamp(-limit, limit)
    s = torch.sigmoid(alpha * a)
    # clamp passes the gradient where the input is within its bounds (torch.clamp's convention)
    da = g * (b + bias) * (s + alpha * a * s * (1 - s)) * (a0 <= limit)
    db = g * a * s * ((b0 >= -limit) & (b0 <= limit))
    dx = torch.zeros(pre, x.numel() // max(pre, 1), dtype=da.dtype, device=x.device)
    dx[:rows] = _clip_interleave_back(da, db, interleaved)
    return dx.reshape(x.shape).to(x.dtype)


@_clipped_swiglu_backward.register_fake
def _(grad, x, group_index, dim, alpha, limit, bias, interleaved):
    return torch.empty_like(x)


def _clip_setup(ctx, inputs, output):
    x, group_index, *cfg = inputs
    ctx.save_for_backward(x, group_index)
    ctx.cfg = cfg


def _clip_backward(ctx, grad):
    x, group_index = ctx.saved_tensors
    return (torch.ops.npu._clipped_swiglu_backward(grad, x, group_index, *ctx.cfg),) + (None,) * 6


register_autograd("npu::_clipped_swiglu", _clip_backward, setup_context=_clip_setup)


def npu_clipped_swiglu(x, *, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True):
    return torch.ops.npu._clipped_swiglu(x, group_index, dim, alpha, limit, bias, interleaved)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_clipped_swiglu(Tensor x, *, Tensor? group_index=None, int dim=-1, float alpha=1.702, "
            "float limit=7.0, float bias=1.0, bool interleaved=True) -> Tensor")
_lib.impl("npu_clipped_swiglu", npu_clipped_swiglu, "CompositeImplicitAutograd")
