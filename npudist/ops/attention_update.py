"""Merging partial attention results (context/sequence parallel), as documented:

* ``npu_ring_attention_update(prev_out, prev_max, prev_sum, cur_out, cur_max, cur_sum, *, actual_seq_qlen=None,
  input_layout="SBH", input_softmax_layout="") -> (out, max, sum)``::

      m = max(prev_max, cur_max);  s = prev_sum * exp(prev_max - m) + cur_sum * exp(cur_max - m)
      out = prev_out * exp(prev_max - m) * prev_sum / s + cur_out * exp(cur_max - m) * cur_sum / s

  SBH: out (S, B, H = N * D) with the statistics (B, N, S, 8) (npu_fusion_attention's, 8 equal copies);
  TND: out (T, N, D) with statistics (T, N, 8) (input_softmax_layout "" or "TND").
* ``npu_attention_update(lse, local_out, update_type) -> (out, lse_out)``: over the sp partial results,
  ``lse_m = max_i lse_i + log(sum_i exp(lse_i - max))`` and ``out = sum_i out_i * exp(lse_i - lse_m)``;
  ``lse_out`` is ``lse_m`` (Ascend fills it for update_type 1).
Both compute in float32 and are forward-only (inference/forward merges, as Ascend's).
"""
from __future__ import annotations

import torch
from torch.library import custom_op


def _ring_views(out, stat, layout, softmax_layout):
    """out and stat (first of the 8 copies) viewed so they broadcast: (..., D) against (..., 1)."""
    if layout == "SBH":
        if out.dim() != 3 or stat.dim() != 4 or stat.shape[0] != out.shape[1] or stat.shape[2] != out.shape[0]:
            raise ValueError(f"npu_ring_attention_update: SBH takes attn_out (S, B, H) and softmax stats (B, N, S, 8), "
                             f"got {tuple(out.shape)} and {tuple(stat.shape)}")
        n = stat.shape[1]
        if out.shape[2] % n:
            raise ValueError(f"npu_ring_attention_update: H={out.shape[2]} is not a multiple of N={n}")
        return out.unflatten(-1, (n, -1)), stat[..., :1].permute(2, 0, 1, 3)  # (S, B, N, D), (S, B, N, 1)
    if out.dim() != 3 or stat.dim() != 3 or tuple(stat.shape[:2]) != tuple(out.shape[:2]):
        raise ValueError(f"npu_ring_attention_update: TND takes attn_out (T, N, D) and softmax stats (T, N, 8), got "
                         f"{tuple(out.shape)} and {tuple(stat.shape)}")
    return out, stat[..., :1]


def _check_ring(prev_out, prev_max, prev_sum, cur_out, cur_max, cur_sum, actual_seq_qlen, layout, softmax_layout):
    op = "npu_ring_attention_update"
    if layout not in ("SBH", "TND"):
        raise ValueError(f"{op}: input_layout must be 'SBH' or 'TND', got {layout!r}")
    if layout == "TND" and softmax_layout not in ("", "TND"):
        raise ValueError(f"{op}: input_softmax_layout must be '' or 'TND' (statistics (T, N, 8)), got "
                         f"{softmax_layout!r}")
    if layout == "TND" and actual_seq_qlen is None:
        raise ValueError(f"{op}: input_layout 'TND' needs actual_seq_qlen (cumulative query lengths)")
    if prev_out.shape != cur_out.shape or not (prev_max.shape == prev_sum.shape == cur_max.shape == cur_sum.shape):
        raise ValueError(f"{op}: prev and cur outputs (and all four statistics) must have one shape")


# custom_op takes no keyword-only tensors: the kernel is positional, the public schema (below) Ascend's.
@custom_op("npu::_ring_attention_update", mutates_args=(), device_types="npu", schema=(
    "(Tensor prev_attn_out, Tensor prev_softmax_max, Tensor prev_softmax_sum, Tensor cur_attn_out, "
    "Tensor cur_softmax_max, Tensor cur_softmax_sum, Tensor? actual_seq_qlen, str input_layout, "
    "str input_softmax_layout) -> (Tensor, Tensor, Tensor)"))
def _ring_attention_update(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out, cur_softmax_max,
                           cur_softmax_sum, actual_seq_qlen, input_layout, input_softmax_layout):
    _check_ring(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out, cur_softmax_max, cur_softmax_sum,
                actual_seq_qlen, input_layout, input_softmax_layout)
    pm, ps, cm, cs = (t.float() for t in (prev_softmax_max, prev_softmax_sum, cur_softmax_max, cur_softmax_sum))
    m = torch.maximum(pm, cm)
    a, b = ps * torch.exp(pm - m), cs * torch.exp(cm - m)
    s = a + b
    po, wa = _ring_views(prev_attn_out.float(), a / s, input_layout, input_softmax_layout)
    co, wb = _ring_views(cur_attn_out.float(), b / s, input_layout, input_softmax_layout)
    out = (po * wa + co * wb).reshape(prev_attn_out.shape).to(prev_attn_out.dtype)
    return out, m, s


@_ring_attention_update.register_fake
def _(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out, cur_softmax_max, cur_softmax_sum,
      actual_seq_qlen, input_layout, input_softmax_layout):
    _check_ring(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out, cur_softmax_max, cur_softmax_sum,
                actual_seq_qlen, input_layout, input_softmax_layout)
    _ring_views(prev_attn_out, prev_softmax_max, input_layout, input_softmax_layout)
    return (torch.empty_like(prev_attn_out), prev_softmax_max.new_empty(prev_softmax_max.shape, dtype=torch.float32),
            prev_softmax_sum.new_empty(prev_softmax_sum.shape, dtype=torch.float32))


def _check_update(lse, local_out, update_type):
    op = "npu_attention_update"
    if update_type not in (0, 1):
        raise ValueError(f"{op}: update_type must be 0 or 1, got {update_type}")
    if not lse or len(lse) != len(local_out):
        raise ValueError(f"{op}: lse and local_out must be non-empty lists of one length (one entry per sp rank)")
    n = lse[0].shape[0]
    for l_, o in zip(lse, local_out):
        if l_.dim() != 1 or l_.shape[0] != n or o.dim() != 2 or o.shape != local_out[0].shape or o.shape[0] != n:
            raise ValueError(f"{op}: every lse must be ({n},) and every local_out ({n}, head_dim)")


@custom_op("npu::npu_attention_update", mutates_args=(), device_types="npu",
           schema="(Tensor[] lse, Tensor[] local_out, int update_type) -> (Tensor, Tensor)")
def npu_attention_update(lse, local_out, update_type):
    _check_update(lse, local_out, update_type)
    ls = torch.stack([t.float() for t in lse])  # (sp, N)
    mx = ls.max(0).values
    lse_m = mx + torch.log(torch.exp(ls - mx).sum(0))
    w = torch.exp(ls - lse_m).unsqueeze(-1)
    out = (torch.stack([o.float() for o in local_out]) * w).sum(0)
    return out.to(local_out[0].dtype), lse_m


@npu_attention_update.register_fake
def _(lse, local_out, update_type):
    _check_update(lse, local_out, update_type)
    return torch.empty_like(local_out[0]), lse[0].new_empty(lse[0].shape, dtype=torch.float32)


def npu_ring_attention_update(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out, cur_softmax_max,
                              cur_softmax_sum, *, actual_seq_qlen=None, input_layout="SBH", input_softmax_layout=""):
    return torch.ops.npu._ring_attention_update(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out,
                                                cur_softmax_max, cur_softmax_sum, actual_seq_qlen, input_layout,
                                                input_softmax_layout)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_ring_attention_update(Tensor prev_attn_out, Tensor prev_softmax_max, Tensor prev_softmax_sum, "
            "Tensor cur_attn_out, Tensor cur_softmax_max, Tensor cur_softmax_sum, *, Tensor? actual_seq_qlen=None, "
            "str input_layout='SBH', str input_softmax_layout='') -> (Tensor, Tensor, Tensor)")
_lib.impl("npu_ring_attention_update", npu_ring_attention_update, "CompositeImplicitAutograd")
