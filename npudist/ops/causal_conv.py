"""torch_npu's masked causal depthwise convolution along the sequence, and its backward operator.

* ``npu::npu_masked_causal_conv1d(input, weight, *, mask=None)``: ``input`` (S, B, H), ``weight`` (W, H) (W is 3
  on Ascend), ``mask`` (B, S) bool. Per channel ``h`` a causal window over the current and the ``W - 1`` previous
  positions, zero before the start: ``out[s, b, h] = sum_k weight[k, h] * input[s - (W - 1) + k, b, h]``, then
  ``out[s, b, :] = 0`` where ``mask[b, s]`` is False. The page leaves the tap order implicit; this is the order of
  ``torch.nn.functional.conv1d`` with ``W - 1`` zeros padded on the left (the causal-conv1d layout of the
  (W, H) / (H, W) weights such ops serve): ``weight[W - 1]`` multiplies the current position.
  Accumulated in float32 (float64 for float64), returned in input's dtype.
* ``npu::npu_masked_causal_conv1d_backward(grad_output, input, weight, *, mask=None) -> (grad_input,
  grad_weight)``: the gradients of the above (the masked gradient, correlated back over the window).
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

_OP = "npu_masked_causal_conv1d"


def _check(op, x, weight, mask, grad=None):
    if x.dim() != 3:
        raise ValueError(f"{op}: input must be 3-D (S, B, H), got {tuple(x.shape)}")
    s, b, h = x.shape
    if weight.dim() != 2 or weight.shape[1] != h or weight.shape[0] < 1:
        raise ValueError(f"{op}: weight must be (W, H) with H = input's last dim {h}, got {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise ValueError(f"{op}: weight's dtype {weight.dtype} must equal input's {x.dtype}")
    if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != (b, s)):
        raise ValueError(f"{op}: mask must be a bool (B, S) = ({b}, {s}) tensor, got {mask.dtype} "
                         f"{tuple(mask.shape)}")
    if grad is not None and (grad.shape != x.shape or grad.dtype != x.dtype):
        raise ValueError(f"{op}: grad_output must match input's shape {tuple(x.shape)} and dtype {x.dtype}, got "
                         f"{grad.dtype} {tuple(grad.shape)}")


def _window(x, w):
    """(W, S, B, H): tap k holds input shifted so that position s sees input[s - (W - 1) + k] (zero before 0)."""
    s = x.shape[0]
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, w - 1, 0))
    return torch.stack([padded[k:k + s] for k in range(w)])


def _up(t):
    return t.double() if t.dtype == torch.float64 else t.float()


def _mask(mask, x):
    return None if mask is None else mask.t().unsqueeze(-1).to(x.dtype)  # (S, B, 1)


# The public operators take ``mask`` keyword-only, which custom_op does not allow for tensors: they are composites
# over these positional kernels, which carry the autograd formula and the fake kernels.
@custom_op("npu::_masked_causal_conv1d", mutates_args=(), device_types="npu",
           schema="(Tensor input, Tensor weight, Tensor? mask) -> Tensor")
def _masked_causal_conv1d(input, weight, mask):
    _check(_OP, input, weight, mask)
    x = _up(input)
    out = (_window(x, weight.shape[0]) * _up(weight)[:, None, None, :]).sum(0)
    m = _mask(mask, x)
    return (out if m is None else out * m).to(input.dtype)


@_masked_causal_conv1d.register_fake
def _(input, weight, mask):
    _check(_OP, input, weight, mask)
    return torch.empty_like(input)


@custom_op("npu::_masked_causal_conv1d_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad_output, Tensor input, Tensor weight, Tensor? mask) -> (Tensor, Tensor)")
def _masked_causal_conv1d_backward(grad_output, input, weight, mask):
    _check(_OP + "_backward", input, weight, mask, grad_output)
    x, g = _up(input), _up(grad_output)
    m = _mask(mask, x)
    if m is not None:
        g = g * m
    w = weight.shape[0]
    s = x.shape[0]
    grad_weight = (_window(x, w) * g).sum((1, 2))
    # input[t] reaches out[t + (W - 1) - k] through tap k
    padded = torch.nn.functional.pad(g, (0, 0, 0, 0, 0, w - 1))
    grad_input = sum(padded[w - 1 - k:w - 1 - k + s] * _up(weight)[k] for k in range(w))
    return grad_input.to(input.dtype), grad_weight.to(weight.dtype)


@_masked_causal_conv1d_backward.register_fake
def _(grad_output, input, weight, mask):
    _check(_OP + "_backward", input, weight, mask, grad_output)
    return torch.empty_like(input), torch.empty_like(weight)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, weight, mask = ctx.saved_tensors
    gx, gw = torch.ops.npu._masked_causal_conv1d_backward(grad.contiguous(), x, weight, mask)
    return gx, gw, None


register_autograd("npu::_masked_causal_conv1d", _backward, setup_context=_setup)


def npu_masked_causal_conv1d(input, weight, *, mask=None):
    return torch.ops.npu._masked_causal_conv1d(input, weight, mask)


def npu_masked_causal_conv1d_backward(grad_output, input, weight, *, mask=None):
    return torch.ops.npu._masked_causal_conv1d_backward(grad_output, input, weight, mask)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_masked_causal_conv1d(Tensor input, Tensor weight, *, Tensor? mask=None) -> Tensor")
_lib.define("npu_masked_causal_conv1d_backward(Tensor grad_output, Tensor input, Tensor weight, *, "
            "Tensor? mask=None) -> (Tensor, Tensor)")
for _fn in (npu_masked_causal_conv1d, npu_masked_causal_conv1d_backward):
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
