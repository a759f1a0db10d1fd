"""torch_npu's Floyd (triangle) attention, ``npu_fused_floyd_attention``, the page's formula as aten ops (autograd,
fake tensors and compile come from them).

``npu_fused_floyd_attention(query_ik, key_ij, value_ij, key_jk, value_jk, *, atten_mask=None, scale_value=1.)
-> (softmax_max, softmax_sum, attention_out)`` (the page's output order): ``query_ik`` (B, H, M, N, D); the
``ij`` pair indexed by (m, k): ``key_ij`` / ``value_ij`` (B, H, M, K, D); the ``jk`` pair by (k, n): ``key_jk`` /
``value_jk`` (B, H, K, N, D) (the page's example; its parameter list swaps the two value shapes). For each
(b, h, m, n) over k::

    s[k] = scale_value * (q[m, n] . key_ij[m, k] + q[m, n] . key_jk[k, n])
    P = softmax(s masked)        out[m, n] = sum_k P[k] * (value_ij[m, k] + value_jk[k, n])

``atten_mask`` (bool / uint8, True = masked out) broadcasts to (B, H, M, N, K) -- the example's (B, 1, M, 1, K);
a row with every k masked gives 0. ``softmax_max`` / ``softmax_sum`` (float32, (B, H, M, N, 8), replicated 8 wide
as Ascend's attention statistics) are the row maximum of the scaled masked scores and the sum of ``exp(s - max)``
(both 0 for a row with every k masked).
Computed in float32 (float64 for float64), the output in query's dtype.
"""
from __future__ import annotations

import torch

_OP = "npu_fused_floyd_attention"
_STAT_WIDTH = 8


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def npu_fused_floyd_attention(query_ik, key_ij, value_ij, key_jk, value_jk, *, atten_mask=None, scale_value=1.0):
    for name, t in (("query_ik", query_ik), ("key_ij", key_ij), ("value_ij", value_ij), ("key_jk", key_jk),
                    ("value_jk", value_jk)):
        if t.dim() != 5:
            _fail(f"{name} must be 5-D, got {tuple(t.shape)}")
        if t.dtype != query_ik.dtype:
            _fail(f"{name}'s dtype {t.dtype} must equal query_ik's {query_ik.dtype}")
    b, h, m, n, d = query_ik.shape
    k = key_ij.shape[3]
    if tuple(key_ij.shape) != (b, h, m, k, d) or tuple(value_ij.shape[:4]) != (b, h, m, k):
        _fail(f"key_ij must be (B, H, M, K, D) = ({b}, {h}, {m}, K, {d}) and value_ij (B, H, M, K, Dv), got "
              f"{tuple(key_ij.shape)} and {tuple(value_ij.shape)}")
    if tuple(key_jk.shape) != (b, h, k, n, d) or tuple(value_jk.shape[:4]) != (b, h, k, n) \
            or value_jk.shape[4] != value_ij.shape[4]:
        _fail(f"key_jk must be (B, H, K, N, D) = ({b}, {h}, {k}, {n}, {d}) and value_jk (B, H, K, N, Dv) with "
              f"value_ij's Dv, got {tuple(key_jk.shape)} and {tuple(value_jk.shape)}")
    acc = torch.float64 if query_ik.dtype == torch.float64 else torch.float32
    q = query_ik.to(acc)
    s = scale_value * (torch.einsum("bhmnd,bhmkd->bhmnk", q, key_ij.to(acc))
                       + torch.einsum("bhmnd,bhknd->bhmnk", q, key_jk.to(acc)))
    if atten_mask is not None:
        if atten_mask.dtype not in (torch.bool, torch.uint8):
            _fail(f"atten_mask must be bool or uint8, got {atten_mask.dtype}")
        try:
            masked = torch.broadcast_to(atten_mask.bool(), s.shape)
        except RuntimeError:
            _fail(f"atten_mask {tuple(atten_mask.shape)} does not broadcast to (B, H, M, N, K) = {tuple(s.shape)}")
        s = s.masked_fill(masked, float("-inf"))
    # a row with every k masked: shift by 0 so its weights are exactly 0; the shift carries no gradient
    top = s.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    e = torch.exp(s - top)
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total == 0, torch.ones_like(total), total)
    out = torch.einsum("bhmnk,bhmkd->bhmnd", p, value_ij.to(acc)) + \
        torch.einsum("bhmnk,bhknd->bhmnd", p, value_jk.to(acc))
    stat = (b, h, m, n, _STAT_WIDTH)
    return (top.float().expand(stat).contiguous(), total.float().expand(stat).contiguous(),
            out.to(query_ik.dtype))


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_fused_floyd_attention(Tensor query_ik, Tensor key_ij, Tensor value_ij, Tensor key_jk, "
            "Tensor value_jk, *, Tensor? atten_mask=None, float scale_value=1.) -> (Tensor, Tensor, Tensor)")
_lib.impl("npu_fused_floyd_attention", npu_fused_floyd_attention, "CompositeImplicitAutograd")
