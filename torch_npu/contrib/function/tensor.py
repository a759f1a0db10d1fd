"""Tensor idioms of Swin, BERT and YOLO models that torch_npu.contrib rewrites for Ascend's kernels; here each is
the computation it documents, in plain ATen (the npu kernels are the same ones either way)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def npu_fast_condition_index_put(x, condition, value):
    """``x[condition] = value`` as a new tensor (``torch.where(condition, value, x)``); ``condition`` bool."""
    if condition.dtype != torch.bool:
        raise TypeError(f"npu_fast_condition_index_put: condition must be a bool tensor, got {condition.dtype}")
    return torch.where(condition, torch.full_like(x, value), x)


class _Roll:
    """``roll(x, shifts, dims)``: ``torch.roll`` of an (N, H, W, C) tensor by two shifts along two dims (Swin's
    shifted windows). Ascend gathers through a cached index for speed; the result is torch.roll's."""

    def __call__(self, x, shifts, dims):
        if x.dim() != 4:
            raise ValueError(f"roll: x must be 4-D (N, H, W, C), got {x.dim()}-D")
        if len(shifts) != 2 or len(dims) != 2:
            raise ValueError(f"roll: needs two shifts and two dims, got shifts={shifts}, dims={dims}")
        return torch.roll(x, shifts=tuple(shifts), dims=tuple(dims))


roll = _Roll()


class _MatmulTranspose(torch.autograd.Function):
    """``matmul_transpose(a, b) = a @ b.transpose(-2, -1)`` (attention scores ``q @ k^T``), batched, with
    gradients ``grad @ b`` and ``grad^T @ a``."""

    @staticmethod
    def forward(ctx, a, b):
        if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-1]:
            raise ValueError(f"matmul_transpose: needs (..., m, k) and (..., n, k), got {tuple(a.shape)} and "
                             f"{tuple(b.shape)}")
        ctx.save_for_backward(a, b)
        return torch.matmul(a, b.transpose(-2, -1))

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ga = torch.matmul(grad, b) if ctx.needs_input_grad[0] else None
        gb = torch.matmul(grad.transpose(-2, -1), a) if ctx.needs_input_grad[1] else None
        return ga, gb


matmul_transpose = _MatmulTranspose.apply


def fuse_add_softmax_dropout(training, dropout, attn_mask, attn_scores, attn_head_size, p=0.5, dim=-1):
    """BERT's attention probabilities: ``dropout(softmax(attn_mask + attn_scores / sqrt(attn_head_size), dim))``.

    ``dropout`` (an ``nn.Dropout``-like module) drops with its own probability when ``training``; ``p`` is the
    probability Ascend's fused kernel uses on its fast path, which takes the place of that module there: when
    ``training`` and ``dropout`` is None, ``p`` is applied (``F.dropout``)."""
    probs = F.softmax(torch.add(attn_mask, attn_scores, alpha=1 / math.sqrt(attn_head_size)), dim=dim)
    if not training:
        return probs
    return dropout(probs) if dropout is not None else F.dropout(probs, p=p, training=True)
