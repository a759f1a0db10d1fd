"""torch_npu's manifold-constrained hyper-connection (mHC) output mixing, ``npu_mhc_post``, with its backward
operator and autograd.

``npu_mhc_post(x, h_res, h_out, h_post)``: ``x`` (..., n, D) the n residual streams, ``h_res`` (..., n, n) the
doubly stochastic mixing matrix, ``h_out`` (..., D) the attention / MLP output, ``h_post`` (..., n) its gates
(leading dims [T] or [B, S]); the page's formula ``x_{l+1} = h_res^T x_l + h_out (x) h_post``, i.e.
``y[..., i, :] = sum_j h_res[..., j, i] x[..., j, :] + h_post[..., i] h_out[..., :]``; without ``h_res``
``y = x + h_out (x) h_post``. Computed in float32 (float64 for float64), returned in x's dtype.
``npu_mhc_post_backward(grad_y, x, h_res, h_out, h_post) -> (grad_x, grad_h_res, grad_h_out, grad_h_post)``: its
gradients; ``grad_h_res`` (..., n, n) float32 is ``sum_d x[..., j, d] grad_y[..., i, d]`` at [j, i] whether or not
``h_res`` was given (the page: "still output, its shape derived from x").
"""
from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

_OP = "npu_mhc_post"


def _up(t):
    return t.double() if t.dtype == torch.float64 else t.float()


def _check(op, x, h_res, h_out, h_post):
    if x.dim() not in (3, 4):
        raise ValueError(f"{op}: x must be (T, n, D) or (B, S, n, D), got {tuple(x.shape)}")
    lead, n, d = tuple(x.shape[:-2]), x.shape[-2], x.shape[-1]
    if tuple(h_out.shape) != lead + (d,):
        raise ValueError(f"{op}: h_out must be {lead + (d,)} (x's leading dims and D), got {tuple(h_out.shape)}")
    if tuple(h_post.shape) != lead + (n,):
        raise ValueError(f"{op}: h_post must be {lead + (n,)} (x's leading dims and n), got {tuple(h_post.shape)}")
    if h_res is not None and tuple(h_res.shape) != lead + (n, n):
        raise ValueError(f"{op}: h_res must be {lead + (n, n)}, got {tuple(h_res.shape)}")


@custom_op("npu::npu_mhc_post", mutates_args=(), device_types="npu",
           schema="(Tensor x, Tensor? h_res, Tensor h_out, Tensor h_post) -> Tensor")
def npu_mhc_post(x, h_res, h_out, h_post):
    _check(_OP, x, h_res, h_out, h_post)
    xs = _up(x)
    mixed = xs if h_res is None else _up(h_res).transpose(-1, -2) @ xs
    return (mixed + _up(h_post).unsqueeze(-1) * _up(h_out).unsqueeze(-2)).to(x.dtype)


@npu_mhc_post.register_fake
def _(x, h_res, h_out, h_post):
    _check(_OP, x, h_res, h_out, h_post)
    return torch.empty_like(x)


@custom_op("npu::npu_mhc_post_backward", mutates_args=(), device_types="npu",
           schema="(Tensor grad_y, Tensor x, Tensor? h_res, Tensor h_out, Tensor h_post) "
                  "-> (Tensor, Tensor, Tensor, Tensor)")
def npu_mhc_post_backward(grad_y, x, h_res, h_out, h_post):
    _check(_OP + "_backward", x, h_res, h_out, h_post)
    if grad_y.shape != x.shape:
        raise ValueError(f"{_OP}_backward: grad_y must have x's shape {tuple(x.shape)}, got {tuple(grad_y.shape)}")
    g, xs = _up(grad_y), _up(x)
    # d/dx_j of sum_i h_res[j, i] x_j . g_i; without h_res the gradient itself (copied: an output may not alias
    # an input)
    grad_x = g.clone() if h_res is None else _up(h_res) @ g
    grad_h_res = xs @ g.transpose(-1, -2)  # [j, i] = x_j . g_i
    grad_h_out = (_up(h_post).unsqueeze(-1) * g).sum(-2)
    grad_h_post = (g * _up(h_out).unsqueeze(-2)).sum(-1)
    res_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (grad_x.to(x.dtype), grad_h_res.to(res_dtype), grad_h_out.to(h_out.dtype),
            grad_h_post.to(h_post.dtype))


@npu_mhc_post_backward.register_fake
def _(grad_y, x, h_res, h_out, h_post):
    _check(_OP + "_backward", x, h_res, h_out, h_post)
    res_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (torch.empty_like(x), x.new_empty(*x.shape[:-1], x.shape[-2], dtype=res_dtype), torch.empty_like(h_out),
            torch.empty_like(h_post))


def _setup(ctx, inputs, output):
    ctx.has_res = inputs[1] is not None
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, h_res, h_out, h_post = ctx.saved_tensors
    gx, gres, gout, gpost = torch.ops.npu.npu_mhc_post_backward(grad.contiguous(), x, h_res, h_out, h_post)
    return gx, (gres.to(h_res.dtype) if ctx.has_res else None), gout, gpost


register_autograd("npu::npu_mhc_post", _backward, setup_context=_setup)
