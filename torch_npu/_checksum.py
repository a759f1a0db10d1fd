"""``torch_npu.matmul_checksum(a, b, c)``: detect a corrupted matmul result (silent data corruption) by an
algorithm-based checksum, as Ascend's feature-anomaly detection does.

For ``c = a @ b`` every row sum of ``c`` equals ``a @ (row sums of b)``. Both sides are computed in float32
and compared against a rounding bound: a correct ``c`` differs from the exact product by its rounding to the
dtype of ``c`` (unit roundoff u_c: 2^-8 for bfloat16, 2^-24 for float32; at most ``u_c * |c|`` per element)
plus float32 accumulation over the inner size k, and the checksums add float32 rounding over the n columns:
``2 * u_c * sum|c| + (k + n + 2) * 2^-24 * sum(|a| @ |b|)`` per row. A larger difference is an anomaly.
"""
from __future__ import annotations

import torch

_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}


def matmul_checksum(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """A bool scalar npu tensor: True when ``c`` is not ``a @ b`` within rounding (an anomaly)."""
    for name, t in (("a", a), ("b", b), ("c", c)):
        if not isinstance(t, torch.Tensor) or t.device.type != "npu":
            raise TypeError(f"matmul_checksum: {name} must be an npu tensor")
        if t.dtype not in _ROUNDOFF:
            raise TypeError(f"matmul_checksum only supports bfloat16 and float32, but got {name}.dtype={t.dtype}")
    if a.shape[-1] != b.shape[-2] or c.shape[-1] != b.shape[-1] or c.shape[-2] != a.shape[-2]:
        raise ValueError(f"matmul_checksum: c {tuple(c.shape)} is not the shape of a {tuple(a.shape)} @ b "
                         f"{tuple(b.shape)}")
    k, n = a.shape[-1], b.shape[-1]
    a32, b32, c32 = a.float(), b.float(), c.float()
    expected = (a32 @ b32.sum(-1, keepdim=True)).squeeze(-1)
    actual = c32.sum(-1)
    bound = (2 * _ROUNDOFF[c.dtype] * c32.abs().sum(-1)
             + (k + n + 2) * 2.0 ** -24 * (a32.abs() @ b32.abs().sum(-1, keepdim=True)).squeeze(-1))
    return ((actual - expected).abs() > bound + 1e-30).any() | ~torch.isfinite(actual).all()
