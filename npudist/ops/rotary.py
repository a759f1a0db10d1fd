"""``npu::npu_rotary_mul(input, r1, r2, rotary_mode='half')``: ``r1 * x + r2 * rotate(x)``.

``half``: ``rotate(x) = cat(-x2, x1)`` with x1, x2 the two halves of the last dim (LLaMA/NeoX style);
``interleave``: the same on the (even, odd) element pairs (GPT-J style). r1/r2 broadcast to x
(typically (1|B, S, 1, D) or (1|B, 1, S, D)); their gradients are reduced to their own shapes.
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

MODES = ("half", "interleave")


def _check(x, r1, r2, mode):
    if mode not in MODES:
        raise ValueError(f"npu_rotary_mul: rotary_mode must be 'half' or 'interleave', got {mode!r}")
    if x.shape[-1] % 2:
        raise ValueError(f"npu_rotary_mul: the last dim of input must be even, got {x.shape[-1]}")
    for name, r in (("r1", r1), ("r2", r2)):
        try:
            torch.broadcast_shapes(x.shape, r.shape)
        except RuntimeError:
            raise ValueError(f"npu_rotary_mul: {name} of shape {tuple(r.shape)} does not broadcast to input "
                             f"{tuple(x.shape)}") from None
        if torch.broadcast_shapes(x.shape, r.shape) != x.shape:
            raise ValueError(f"npu_rotary_mul: {name} of shape {tuple(r.shape)} would enlarge input "
                             f"{tuple(x.shape)}")


def _rotate(x: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def _rotate_transposed(g: torch.Tensor, mode: str) -> torch.Tensor:
    """Adjoint of _rotate: rotate(x) . g == x . _rotate_transposed(g)."""
    return -_rotate(g, mode)


@custom_op("npu::npu_rotary_mul", mutates_args=(), device_types="npu",
           schema="(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor")
def npu_rotary_mul(x, r1, r2, rotary_mode="half"):
    _check(x, r1, r2, rotary_mode)
    return x * r1 + _rotate(x, rotary_mode) * r2


@npu_rotary_mul.register_fake
def _(x, r1, r2, rotary_mode="half"):
    _check(x, r1, r2, rotary_mode)
    return torch.empty_like(x)


@custom_op("npu::npu_rotary_mul_backward", mutates_args=(), device_types="npu",
           schema=("(Tensor grad, Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') "
                   "-> (Tensor, Tensor, Tensor)"))
def npu_rotary_mul_backward(grad, x, r1, r2, rotary_mode="half"):
    dx = grad * r1 + _rotate_transposed(grad * r2, rotary_mode)
    dr1 = (grad * x).sum_to_size(r1.shape)
    dr2 = (grad * _rotate(x, rotary_mode)).sum_to_size(r2.shape)
    return dx, dr1.to(r1.dtype), dr2.to(r2.dtype)


@npu_rotary_mul_backward.register_fake
def _(grad, x, r1, r2, rotary_mode="half"):
    return torch.empty_like(x), torch.empty_like(r1), torch.empty_like(r2)


def _setup(ctx, inputs, output):
    x, r1, r2, mode = inputs
    ctx.save_for_backward(x, r1, r2)
    ctx.mode = mode


def _backward(ctx, grad):
    x, r1, r2 = ctx.saved_tensors
    dx, dr1, dr2 = torch.ops.npu.npu_rotary_mul_backward(grad, x, r1, r2, ctx.mode)
    return dx, dr1, dr2, None


register_autograd("npu::npu_rotary_mul", _backward, setup_context=_setup)
