"""torch_npu's ``npu_fused_infer_attention_score_v2``: ``npu_fused_infer_attention_score`` (npudist.ops.
infer_attention, its formula ``softmax(softmax_scale * Q K^T + pse_shift, masked) V``, the prompt branch for
Q_S > 1 and the incremental one for Q_S = 1, layouts BSH / BSND / BNSD / BNSD_BSND, GQA, sparse modes 0-4, page
attention) under v2's argument names: ``num_query_heads`` (num_heads), ``softmax_scale`` (scale),
``actual_seq_qlen`` / ``actual_seq_kvlen`` (actual_seq_lengths / actual_seq_lengths_kv), ``return_softmax_lse``
(softmax_lse_flag).

New in v2: ``learnable_sink`` (Q_N,), a per-head "sink token" logit that takes part in each row's softmax without
a value: ``p_j = exp(s_j) / (sum_k exp(s_k) + exp(sink[n]))``. The output is therefore the sink-free output times
``sigmoid(lse - sink[n])``, with ``lse`` the row's log-sum-exp of its scaled, masked scores; ``softmax_lse`` stays
that documented log-sum-exp of the query-key scores (the page's formula does not include the sink).
``inner_precise`` (0-3) selects Ascend's precision / row-invalid handling; here every mode computes in float32 and
a row with no allowed key gives 0 (what the row-invalid correction produces).

Refused with a ValueError naming the argument (as in v1: their scaling formulas are not given on the page, or
the page marks them reserved): ``query_rope`` / ``key_rope`` (MLA), the ``dequant_*`` / ``quant_*`` parameters,
the ``*_dtype`` parameters (reserved, or the output type of quantised inputs) and layouts other than the four
above (TND / NTD / the *_NBSD outputs).
"""
from __future__ import annotations

import torch

from npudist.ops.infer_attention import _fail, _refuse, fused_infer_attention

_OP = "npu_fused_infer_attention_score_v2"


def _apply_sink(op, out, lse, sink, layout, heads):
    if sink.dim() != 1 or sink.shape[0] != heads:
        _fail(op, f"learnable_sink must be 1-D with num_query_heads = {heads} entries, got {tuple(sink.shape)}")
    factor = torch.sigmoid(lse - sink.float().view(1, -1, 1, 1))  # (B, N, Q_S, 1)
    if layout == "BNSD":
        return (out.float() * factor).to(out.dtype)
    factor = factor.transpose(1, 2)  # (B, Q_S, N, 1): BSND / BNSD_BSND, and BSH viewed per head
    if layout == "BSH":
        b, s, h = out.shape
        return (out.float().view(b, s, heads, h // heads) * factor).reshape(b, s, h).to(out.dtype)
    return (out.float() * factor).to(out.dtype)


def npu_fused_infer_attention_score_v2(
        query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None, actual_seq_qlen=None,
        actual_seq_kvlen=None, block_table=None, dequant_scale_query=None, dequant_scale_key=None,
        dequant_offset_key=None, dequant_scale_value=None, dequant_offset_value=None, dequant_scale_key_rope=None,
        quant_scale_out=None, quant_offset_out=None, quant_scale_p=None, learnable_sink=None, num_query_heads=1,
        num_key_value_heads=0, softmax_scale=1.0, pre_tokens=2147483647, next_tokens=2147483647, input_layout="BSH",
        sparse_mode=0, block_size=0, query_quant_mode=0, key_quant_mode=0, value_quant_mode=0, inner_precise=0,
        return_softmax_lse=False, query_dtype=None, key_dtype=None, value_dtype=None, query_rope_dtype=None,
        key_rope_dtype=None, key_shared_prefix_dtype=None, value_shared_prefix_dtype=None,
        dequant_scale_query_dtype=None, dequant_scale_key_dtype=None, dequant_scale_value_dtype=None,
        dequant_scale_key_rope_dtype=None, out_dtype=None):
    op = _OP
    # the quant modes only select how the (refused) dequant parameters apply, so they are not checked on their own
    _refuse(op, query_rope=query_rope, key_rope=key_rope, dequant_scale_query=dequant_scale_query,
            dequant_scale_key=dequant_scale_key, dequant_offset_key=dequant_offset_key,
            dequant_scale_value=dequant_scale_value, dequant_offset_value=dequant_offset_value,
            dequant_scale_key_rope=dequant_scale_key_rope, quant_scale_out=quant_scale_out,
            quant_offset_out=quant_offset_out, quant_scale_p=quant_scale_p, query_dtype=query_dtype,
            key_dtype=key_dtype, value_dtype=value_dtype, query_rope_dtype=query_rope_dtype,
            key_rope_dtype=key_rope_dtype, key_shared_prefix_dtype=key_shared_prefix_dtype,
            value_shared_prefix_dtype=value_shared_prefix_dtype, dequant_scale_query_dtype=dequant_scale_query_dtype,
            dequant_scale_key_dtype=dequant_scale_key_dtype, dequant_scale_value_dtype=dequant_scale_value_dtype,
            dequant_scale_key_rope_dtype=dequant_scale_key_rope_dtype, out_dtype=out_dtype)
    if inner_precise not in (0, 1, 2, 3):
        _fail(op, f"inner_precise must be 0, 1, 2 or 3, got {inner_precise}")
    out, lse = fused_infer_attention(op, query, key, value, pse_shift, atten_mask, actual_seq_qlen, actual_seq_kvlen,
                                     block_table, None, num_query_heads, softmax_scale, pre_tokens, next_tokens,
                                     input_layout, num_key_value_heads, sparse_mode, block_size)
    if learnable_sink is not None:
        out = _apply_sink(op, out, lse, learnable_sink, input_layout, num_query_heads)
    return out, lse if return_softmax_lse else query.new_zeros(1, dtype=torch.float32)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define(
    "npu_fused_infer_attention_score_v2(Tensor query, Tensor key, Tensor value, *, Tensor? query_rope=None, "
    "Tensor? key_rope=None, Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, "
    "SymInt[]? actual_seq_kvlen=None, Tensor? block_table=None, Tensor? dequant_scale_query=None, "
    "Tensor? dequant_scale_key=None, Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, "
    "Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, Tensor? quant_scale_out=None, "
    "Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, Tensor? learnable_sink=None, int num_query_heads=1, "
    "int num_key_value_heads=0, float softmax_scale=1.0, int pre_tokens=2147483647, int next_tokens=2147483647, "
    "str input_layout=\"BSH\", int sparse_mode=0, int block_size=0, int query_quant_mode=0, int key_quant_mode=0, "
    "int value_quant_mode=0, int inner_precise=0, bool return_softmax_lse=False, int? query_dtype=None, "
    "int? key_dtype=None, int? value_dtype=None, int? query_rope_dtype=None, int? key_rope_dtype=None, "
    "int? key_shared_prefix_dtype=None, int? value_shared_prefix_dtype=None, int? dequant_scale_query_dtype=None, "
    "int? dequant_scale_key_dtype=None, int? dequant_scale_value_dtype=None, int? dequant_scale_key_rope_dtype=None, "
    "int? out_dtype=None) -> (Tensor, Tensor)")
_lib.impl("npu_fused_infer_attention_score_v2", npu_fused_infer_attention_score_v2, "CompositeImplicitAutograd")
