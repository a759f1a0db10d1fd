"""``aten::matmul_backward`` on npu: ``(grad @ other^T, self^T @ grad)``, each reduced to its input's shape.

Upstream torch has no dense kernel for it; Ascend's torch_npu provides one (its autograd for matmul records it),
and clients of torch_npu call it and register DTensor strategies for it (sharding.py has npudist's). 1-D
operands follow torch.matmul's rules (a vector is a (1, n) row on the left, an (n, 1) column on the right).
Both gradients are computed whatever ``mask`` says (it only tells which the caller needs).
"""
from __future__ import annotations

import torch


def _as_matrices(grad, self, other):
    s = self.unsqueeze(0) if self.dim() == 1 else self
    o = other.unsqueeze(-1) if other.dim() == 1 else other
    batch = torch.broadcast_shapes(s.shape[:-2], o.shape[:-2])
    g = grad.reshape(*batch, s.shape[-2], o.shape[-1])
    return g, s, o


def _matmul_backward(grad, self, other, mask):
    if self.dim() == 0 or other.dim() == 0:
        raise ValueError("matmul_backward: both operands need at least one dim (as torch.matmul)")
    g, s, o = _as_matrices(grad, self, other)
    dself = (g @ o.transpose(-1, -2)).sum_to_size(s.shape).reshape(self.shape)
    dother = (s.transpose(-1, -2) @ g).sum_to_size(o.shape).reshape(other.shape)
    return dself, dother


def _matmul_backward_meta(grad, self, other, mask):
    return torch.empty_like(self), torch.empty_like(other)


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("matmul_backward", _matmul_backward, "PrivateUse1")
_lib.impl("matmul_backward", _matmul_backward_meta, "Meta")
