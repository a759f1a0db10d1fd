"""torch_npu's output allocators for graph capture of the fused inference attention,
``_npu_fused_infer_attention_score_infer_output`` and its v2: from the same arguments as the attention operator
they work out its outputs' shapes and dtypes and allocate them (uninitialised), for the attention to fill in.

``attention_out`` has query's shape with value's head dim D (the output layout: BSH (B, S, N * D), BSND and
BNSD_BSND (B, S, N, D), BNSD (B, N, S, D), TND (T, N, D)); value's D is its last dim when 4-D, or its hidden size
over the key/value head count (``num_key_value_heads``, 0: as many as the query's) when 3-D (BSH, or a page
attention pool (blocks, block_size, H)). Its dtype is int8 with an output quantisation scale (``quant_scale2`` /
``quant_scale_out``), else query's. ``softmax_lse`` is float32 (B, N, Q_S, 1) ((T, N, 1) for TND) when asked for,
else a (1,) zero, as the attention operator returns it.

Refused with a ValueError naming the argument: v2's ``query_dtype``, ``value_dtype`` and ``out_dtype`` (the
attention operator refuses them: they describe quantised inputs / outputs).
"""
from __future__ import annotations

import torch

_LAYOUTS = {"BSH": 3, "BSND": 4, "BNSD": 4, "BNSD_BSND": 4, "TND": 3}


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _outputs(op, query, value, input_layout, quantised, block_table, num_heads, num_key_value_heads, with_lse):
    if input_layout not in _LAYOUTS:
        _fail(op, f"input_layout must be one of {sorted(_LAYOUTS)}, got {input_layout!r}")
    if query.dim() != _LAYOUTS[input_layout]:
        _fail(op, f"query must be {_LAYOUTS[input_layout]}-D in layout {input_layout}, got {tuple(query.shape)}")
    if num_heads <= 0:
        _fail(op, f"the query head count must be positive, got {num_heads}")
    kv_heads = num_key_value_heads or num_heads
    if value.dim() == 4:
        d = value.shape[-1]
    elif (value.dim() == 3 and input_layout != "TND") or block_table is not None:
        if value.shape[-1] % kv_heads:
            _fail(op, f"value's hidden size {value.shape[-1]} is not a multiple of its {kv_heads} heads")
        d = value.shape[-1] // kv_heads
    else:
        d = value.shape[-1]  # TND (T, N, D)
    if input_layout == "BSH":
        b, s = query.shape[:2]
        out_shape, lse_shape = (b, s, num_heads * d), (b, num_heads, s, 1)
    elif input_layout == "BNSD":
        b, n, s = query.shape[:3]
        out_shape, lse_shape = (b, n, s, d), (b, n, s, 1)
    elif input_layout == "TND":
        t, n = query.shape[:2]
        out_shape, lse_shape = (t, n, d), (t, n, 1)
    else:  # BSND in, or BNSD in with BSND out
        if input_layout == "BSND":
            b, s, n = query.shape[:3]
        else:
            b, n, s = query.shape[:3]
        out_shape, lse_shape = (b, s, n, d), (b, n, s, 1)
    out = query.new_empty(out_shape, dtype=torch.int8 if quantised else query.dtype)
    lse = query.new_empty(lse_shape, dtype=torch.float32) if with_lse else query.new_zeros(1, dtype=torch.float32)
    return out, lse


def _npu_fused_infer_attention_score_infer_output(query, value, *, input_layout="BSH", quant_scale2=None,
                                                  block_table=None, num_heads=1, num_key_value_heads=0,
                                                  softmax_lse_flag=False, query_rope=None):
    return _outputs("_npu_fused_infer_attention_score_infer_output", query, value, input_layout,
                    quant_scale2 is not None, block_table, num_heads, num_key_value_heads, softmax_lse_flag)


def _npu_fused_infer_attention_score_v2_infer_output(query, value, *, query_dtype=None, value_dtype=None,
                                                     input_layout="BSH", quant_scale_out=None, block_table=None,
                                                     num_query_heads=1, num_key_value_heads=0,
                                                     return_softmax_lse=False, query_rope=None, out_dtype=None):
    op = "_npu_fused_infer_attention_score_v2_infer_output"
    for name, v in (("query_dtype", query_dtype), ("value_dtype", value_dtype), ("out_dtype", out_dtype)):
        if v is not None:
            _fail(op, f"{name} is not supported (npu_fused_infer_attention_score_v2 refuses it: quantised types)")
    return _outputs(op, query, value, input_layout, quant_scale_out is not None, block_table, num_query_heads,
                    num_key_value_heads, return_softmax_lse)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("_npu_fused_infer_attention_score_infer_output(Tensor query, Tensor value, *, str input_layout=\"BSH\", "
            "Tensor? quant_scale2=None, Tensor? block_table=None, int num_heads=1, int num_key_value_heads=0, "
            "bool softmax_lse_flag=False, Tensor? query_rope=None) -> (Tensor, Tensor)")
_lib.define("_npu_fused_infer_attention_score_v2_infer_output(Tensor query, Tensor value, *, int? query_dtype=None, "
            "int? value_dtype=None, str input_layout=\"BSH\", Tensor? quant_scale_out=None, Tensor? block_table=None, "
            "int num_query_heads=1, int num_key_value_heads=0, bool return_softmax_lse=False, Tensor? query_rope=None, "
            "int? out_dtype=None) -> (Tensor, Tensor)")
for _fn in (_npu_fused_infer_attention_score_infer_output, _npu_fused_infer_attention_score_v2_infer_output):
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
