"""``npu_fusion_attention_v2`` and ``npu_fusion_attention_v3``: Ascend's later call forms of the fused attention,
composed over ``npu::npu_fusion_attention`` (npudist/ops/attention.py), whose kernel, fake kernel and backward they
reuse (autograd and torch.compile see the v1 operator they decompose into).

v2 (keyword-only after ``input_layout``): ``pre_tokens``/``next_tokens`` spellings; ``query_rope``/``key_rope``
(TND): ``scale·(Q Kᵀ + Q_rope K_ropeᵀ)``, i.e. attention over ``[Q, Q_rope]`` and ``[K, K_rope]`` concatenated on
the head dim (the gradients split back); ``softmax_layout`` "" gives TND statistics as (N, T, 8) (Ascend's NTD
default), "TND" as (T, N, 8). v3: v1's arguments with ``actual_seq_qlen``/``actual_seq_kvlen`` as int64 tensors and
``softmax_layout``; returns ``(out, softmax_max, softmax_sum, softmax_out, seed, offset)`` with seed and offset as
int64 tensors on the CPU (as torch_npu outside aclgraph).

``sink`` (v2 and v3; float32 (head_num,), the BSH/SBH/BSND/BNSD layouts): a per-head logit in every row's softmax,
``m = max(sink, max(S))``, ``out = Σ e^(S-m) V / (Σ e^(S-m) + e^(sink-m))``, with gradients for q, k, v and sink.
It is v1 attention over one extra key per head: queries gain a last dim ``sink / scale``, the extra key is the unit
vector on that dim (score ``sink``) with a zero value, real keys get a 0 there, and the mask (made explicit from
any sparse mode) keeps the extra key visible. The softmax statistics then include the sink, as Ascend's.

``pse``/``pse_type``/``q_start_idx``/``kv_start_idx``, ``prefix``, ``sink`` under TND, an external ``dropout_mask``
and caller-chosen dropout ``seed``/``offset`` are not provided: they raise ``ValueError`` (docs/torch_npu.md).
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


def _attention(op, query, key, value, head_num, input_layout, atten_mask, scale, keep_prob, pre, nxt, inner_precise,
               actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync, sink):
    if sink is None:
        return _v1(op, query, key, value, head_num, input_layout, atten_mask, scale, keep_prob, pre, nxt,
                   inner_precise, actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync)
    return _v1_with_sink(op, query, key, value, head_num, input_layout, atten_mask, scale, keep_prob, pre, nxt,
                         inner_precise, sparse_mode, gen_mask_parallel, sync, sink)


def _v1_with_sink(op, query, key, value, head_num, layout, atten_mask, scale, keep_prob, pre, nxt, inner_precise,
                  sparse_mode, gen_mask_parallel, sync, sink):
    from npudist.ops import attention as fa  # noqa: PLC0415 (v1's layout and mask helpers)

    if layout == "TND":
        _fail(op, "sink with input_layout 'TND' is not supported; use a padded layout (BSH, SBH, BSND, BNSD)")
    if sink.dim() != 1 or sink.shape[0] != head_num or not sink.is_floating_point():
        _fail(op, f"sink must be a floating (head_num={head_num},) tensor, got {sink.dtype} {tuple(sink.shape)}")
    if scale == 0:
        _fail(op, "sink needs a non-zero scale (the sink enters the scores as query dim sink / scale)")
    try:  # the caller's arguments as v1 would check them (layout, dtypes, mask kind and shape)
        fa._check_args(query, key, value, head_num, layout, None, None, atten_mask, keep_prob, None, None, None,
                       sparse_mode)
        d = fa._head_dim(query, head_num, layout)
        q, k, v = (fa._to_bnsd(t, layout, d) for t in (query, key, value))
        mask = fa._mask(atten_mask, sparse_mode, pre, nxt, q.shape[2], k.shape[2], q.device)
    except ValueError as e:
        raise ValueError(str(e).replace("npu_fusion_attention:", f"{op}:", 1)) from None
    b, n, sq, _ = q.shape
    nkv, dv = k.shape[1], v.shape[-1]
    q = torch.cat([q, (sink.to(q.dtype) / scale).view(1, n, 1, 1).expand(b, n, sq, 1)], -1)
    sink_key = torch.zeros(b, nkv, 1, k.shape[-1] + 1, dtype=k.dtype, device=k.device)
    sink_key[..., -1] = 1
    k = torch.cat([sink_key, torch.cat([k, k.new_zeros(*k.shape[:-1], 1)], -1)], 2)
    v = torch.cat([v.new_zeros(b, nkv, 1, dv), v], 2)
    if mask is not None:  # explicit, with the sink key (first) always visible
        mask = torch.cat([mask.new_zeros(*mask.shape[:-1], 1), mask], -1)
    out, smax, ssum, soft, s, o, num = _v1(op, q, k, v, n, "BNSD", mask, scale, keep_prob, _NO_BAND, _NO_BAND,
                                           inner_precise, None, None, 1 if mask is not None else 0,
                                           gen_mask_parallel, sync)
    return fa._from_bnsd(out, layout).contiguous(), smax, ssum, soft, s, o, num


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
            kv_start_idx=kv_start_idx, dropout_mask=dropout_mask)
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
    out, smax, ssum, soft, s, o, n = _attention(op, query, key, value, head_num, input_layout, atten_mask, scale,
                                                keep_prob, pre_tokens, next_tokens, inner_precise, actual_seq_qlen,
                                                actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync, sink)
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
    _refuse(op, pse=pse, padding_mask=padding_mask, prefix=prefix)
    out, smax, ssum, soft, s, o, _ = _attention(
        op, query, key, value, head_num, input_layout, atten_mask, scale, keep_prob, pre_tockens, next_tockens,
        inner_precise, _lengths(op, "actual_seq_qlen", actual_seq_qlen),
        _lengths(op, "actual_seq_kvlen", actual_seq_kvlen), sparse_mode, gen_mask_parallel, sync, sink)
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
