"""``npu_fusion_attention_v2`` and ``npu_fusion_attention_v3``: Ascend's later call forms of the fused attention,
composed over ``npu::npu_fusion_attention`` (npudist/ops/attention.py), whose kernel, fake kernel and backward they
reuse (autograd and torch.compile see the v1 operator they decompose into).

v2 (keyword-only after ``input_layout``): ``pre_tokens``/``next_tokens`` spellings; ``query_rope``/``key_rope``
(TND): ``scale·(Q Kᵀ + Q_rope K_ropeᵀ)``, i.e. attention over ``[Q, Q_rope]`` and ``[K, K_rope]`` concatenated on
the head dim (the gradients split back); ``softmax_layout`` "" gives TND statistics as (N, T, 8) (Ascend's NTD
default), "TND" as (T, N, 8). v3: v1's arguments with ``actual_seq_qlen``/``actual_seq_kvlen`` as int64 tensors and
``softmax_layout``; returns ``(out, softmax_max, softmax_sum, softmax_out, seed, offset)`` with seed and offset as
int64 tensors on the CPU (as torch_npu outside aclgraph).

``pse``/``pse_type``/``q_start_idx``/``kv_start_idx``, ``sink``, ``prefix``, an external ``dropout_mask`` and
caller-chosen dropout ``seed``/``offset`` are not provided: they raise ``ValueError`` (docs/torch_npu.md).
"""
from __future__ import annotations

import torch

_NO_BAND = 2147483647


def _fail(op: str, msg: str):
    raise ValueError(f"{op}: {msg}")


def _v1(op, query, key, value, head_num, input_layout, atten_mask, scale, keep_prob, pre, nxt, inner_precise,
        actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync):
    try:
        return torch.ops.npu.npu_fusion_attention(
            query, key, value, head_num, input_layout, None, None, atten_mask, scale, keep_prob, pre, nxt,
            inner_precise, None, actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync)
    except ValueError as e:  # name the operator the caller used
        msg = str(e)
        if msg.startswith("npu_fusion_attention: "):
            msg = msg[len("npu_fusion_attention: "):]
        raise ValueError(f"{op}: {msg}") from None


def _softmax_layout(op, input_layout, softmax_layout, smax, ssum):
    if softmax_layout not in ("", "TND") or (softmax_layout == "TND" and input_layout != "TND"):
        _fail(op, f"softmax_layout must be '' or 'TND' (the latter only with input_layout 'TND'), got "
                  f"{softmax_layout!r}")
    if input_layout == "TND" and softmax_layout == "":  # Ascend's default NTD statistics
        return smax.transpose(0, 1).contiguous(), ssum.transpose(0, 1).contiguous()
    return smax, ssum


def _refuse(op, **given):
    for name, value in given.items():
        if value is not None:
            _fail(op, f"{name} is not supported by npudist (see docs/torch_npu.md); pass None")


def npu_fusion_attention_v2(query, key, value, head_num, input_layout, *, pse=None, padding_mask=None,
                            atten_mask=None, query_rope=None, key_rope=None, scale=1.0, keep_prob=1.0,
                            pre_tokens=_NO_BAND, next_tokens=_NO_BAND, inner_precise=0, prefix=None,
                            actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True,
                            sync=False, pse_type=1, q_start_idx=None, kv_start_idx=None, softmax_layout="",
                            sink=None, dropout_mask=None, seed=0, offset=0):
    op = "npu_fusion_attention_v2"
    input_layout = input_layout.upper()
    _refuse(op, pse=pse, padding_mask=padding_mask, prefix=prefix, q_start_idx=q_start_idx,
            kv_start_idx=kv_start_idx, sink=sink, dropout_mask=dropout_mask)
    if pse_type != 1:
        _fail(op, f"pse_type {pse_type} (internally generated or multiply-first position bias) is not supported; "
                  "only the default 1")
    if (seed or offset) and keep_prob < 1.0:
        _fail(op, "a caller-chosen dropout seed/offset is not supported: dropout draws from the npu generator "
                  "(its state is returned for the backward)")
    if (query_rope is None) != (key_rope is None):
        _fail(op, "query_rope and key_rope must be given together")
    if query_rope is not None:
        if input_layout != "TND" or atten_mask is None or keep_prob != 1.0:
            _fail(op, "query_rope/key_rope need input_layout 'TND', an atten_mask and keep_prob 1 (as Ascend)")
        if query_rope.shape[:-1] != query.shape[:-1] or key_rope.shape[:-1] != key.shape[:-1] \
                or query_rope.shape[-1] != key_rope.shape[-1]:
            _fail(op, f"query_rope/key_rope must match query/key but for an equal rope head dim, got "
                      f"{tuple(query_rope.shape)} and {tuple(key_rope.shape)}")
        query, key = torch.cat([query, query_rope], -1), torch.cat([key, key_rope], -1)
    out, smax, ssum, soft, s, o, n = _v1(op, query, key, value, head_num, input_layout, atten_mask, scale,
                                         keep_prob, pre_tokens, next_tokens, inner_precise, actual_seq_qlen,
                                         actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync)
    smax, ssum = _softmax_layout(op, input_layout, softmax_layout, smax, ssum)
    return out, smax, ssum, soft, s, o, n


def _lengths(op, name, t):
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
            _fail(op, f"{name} must be a 1-D int64 tensor of cumulative lengths, got {t.dtype} {tuple(t.shape)}")
        return [int(v) for v in t.tolist()]
    return list(t)


def npu_fusion_attention_v3(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                            atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=_NO_BAND, next_tockens=_NO_BAND,
                            inner_precise=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                            sparse_mode=0, gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    op = "npu_fusion_attention_v3"
    _refuse(op, pse=pse, padding_mask=padding_mask, prefix=prefix, sink=sink)
    out, smax, ssum, soft, s, o, _ = _v1(
        op, query, key, value, head_num, input_layout, atten_mask, scale, keep_prob, pre_tockens, next_tockens,
        inner_precise, _lengths(op, "actual_seq_qlen", actual_seq_qlen),
        _lengths(op, "actual_seq_kvlen", actual_seq_kvlen), sparse_mode, gen_mask_parallel, sync)
    smax, ssum = _softmax_layout(op, input_layout, softmax_layout, smax, ssum)
    return out, smax, ssum, soft, torch.tensor(s, dtype=torch.int64), torch.tensor(o, dtype=torch.int64)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define(
    "npu_fusion_attention_v2(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, *, "
    "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, Tensor? query_rope=None, "
    "Tensor? key_rope=None, float scale=1., float keep_prob=1., int pre_tokens=2147483647, "
    "int next_tokens=2147483647, int inner_precise=0, int[]? prefix=None, int[]? actual_seq_qlen=None, "
    "int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, "
    "int pse_type=1, int[]? q_start_idx=None, int[]? kv_start_idx=None, str softmax_layout=\"\", "
    "Tensor? sink=None, Tensor? dropout_mask=None, int seed=0, int offset=0) "
    "-> (Tensor, Tensor, Tensor, Tensor, int, int, int)")
_lib.define(
    "npu_fusion_attention_v3(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
    "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., "
    "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, SymInt[]? prefix=None, "
    "Tensor? actual_seq_qlen=None, Tensor? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, "
    "bool sync=False, str softmax_layout=\"\", Tensor? sink=None) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
# Composite: autograd, the fake kernel and the backward are npu_fusion_attention's.
_lib.impl("npu_fusion_attention_v2", npu_fusion_attention_v2, "CompositeImplicitAutograd")
_lib.impl("npu_fusion_attention_v3", npu_fusion_attention_v3, "CompositeImplicitAutograd")
