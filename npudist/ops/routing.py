"""MoE inference routing: the trio ``npu_moe_init_routing`` / ``npu_moe_finalize_routing`` /
``npu_moe_compute_expert_tokens`` (at the end of this file), ``npu_moe_init_routing_v2`` (expand tokens by expert, optional dynamic int8 quant) and
``npu_grouped_matmul_finalize_routing`` (experts' grouped matmul fused with the weighted combine).

``npu_moe_init_routing_v2(x, expert_idx, *, scale, offset, active_num, expert_capacity, expert_num,
drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag, quant_mode, active_expert_range, row_idx_type)
-> (expanded_x, expanded_row_idx, expert_token_cumsum_or_count, expanded_scale)``: the pairs ``i = row * K + k`` of
expert_idx (NUM_ROWS, K) whose expert lies in ``active_expert_range = [start, end)`` (default ``[0, expert_num)``)
are sorted stably by expert; slot j of the dropless output holds ``x[src_j // K]`` (the first
``active_num`` slots when active_num > 0). drop_pad_mode 1 gives each expert ``expert_capacity`` slots
(``expanded_x`` (expert_num, capacity, H)), keeping its first pairs in order and padding with zeros; its token
counts are the ones before dropping.
``expanded_row_idx``: row_idx_type 0 (gather) is indexed by pair (its slot, -1 when not kept), 1 (scatter) by slot
(its pair, -1 past the kept ones). Token counts (int64, expert_tokens_num_flag): type 0 cumulative, 1 per
expert of the range, 2 (expert, count) pairs of the non-empty experts followed by a (0, 0) end marker.
``expanded_scale``: quant_mode -1 gathers ``scale`` (NUM_ROWS,) per slot (zeros without scale); quant_mode 1
(dynamic int8) multiplies each row by its expert's smooth scale ``scale[expert - start]`` (or the single row of a
(1, H) scale), quantises it symmetrically (``s = max|row| / 127``, ``round(row / s)``) and returns s.
Unused slots and rows are zero (Ascend leaves them undefined).
"""
from __future__ import annotations

import torch
from torch.library import custom_op

from npudist.ops.moe import _acc_dtype

_INIT = "npu_moe_init_routing_v2"
_FINALIZE = "npu_grouped_matmul_finalize_routing"


def _fail(op: str, msg: str):
    raise ValueError(f"{op}: {msg}")


def _check_init(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num, drop_pad_mode,
                expert_tokens_num_type, quant_mode, active_expert_range, row_idx_type) -> tuple[int, int]:
    """(start, end) of the active experts, after validating every argument."""
    if x.dim() != 2 or expert_idx.dim() != 2 or x.shape[0] != expert_idx.shape[0]:
        _fail(_INIT, f"x (NUM_ROWS, H) and expert_idx (NUM_ROWS, K) must be 2-D with equal rows, got "
                     f"{tuple(x.shape)} and {tuple(expert_idx.shape)}")
    if expert_idx.dtype not in (torch.int32, torch.int64):
        _fail(_INIT, f"expert_idx must be int32, got {expert_idx.dtype}")
    if expert_num <= 0:
        _fail(_INIT, f"expert_num must be > 0, got {expert_num}")
    if active_num < -1:
        _fail(_INIT, f"active_num must be >= -1 (-1 and 0: every row), got {active_num}")
    if drop_pad_mode not in (0, 1):
        _fail(_INIT, f"drop_pad_mode must be 0 (dropless) or 1 (drop and pad), got {drop_pad_mode}")
    if expert_tokens_num_type not in (0, 1, 2):
        _fail(_INIT, f"expert_tokens_num_type must be 0 (cumsum), 1 (count) or 2 (key-value), got "
                     f"{expert_tokens_num_type}")
    if row_idx_type not in (0, 1):
        _fail(_INIT, f"row_idx_type must be 0 (gather) or 1 (scatter), got {row_idx_type}")
    if quant_mode not in (-1, 1):
        _fail(_INIT, f"quant_mode must be -1 (no quantisation) or 1 (dynamic int8); static (0) is not supported "
                     f"by Ascend and the fp8/mx modes are not provided, got {quant_mode}")
    if offset is not None:
        _fail(_INIT, "offset is not used by quant_mode -1 or 1 (pass None)")
    if active_expert_range:
        if len(active_expert_range) != 2 or not 0 <= active_expert_range[0] < active_expert_range[1] <= expert_num:
            _fail(_INIT, f"active_expert_range must be [start, end) with 0 <= start < end <= expert_num "
                         f"({expert_num}), got {list(active_expert_range)}")
        start, end = active_expert_range
    else:
        start, end = 0, expert_num
    if drop_pad_mode == 1:
        if expert_capacity <= 0:
            _fail(_INIT, f"drop_pad_mode 1 needs expert_capacity > 0, got {expert_capacity}")
        if (start, end) != (0, expert_num) or row_idx_type != 0 or active_num > 0:
            _fail(_INIT, "drop_pad_mode 1 takes every expert (no active_expert_range), row_idx_type 0 and no "
                         "active_num")
    if quant_mode == 1:
        if not x.is_floating_point():
            _fail(_INIT, f"quant_mode 1 quantises a floating x, got {x.dtype}")
        if scale is not None and (scale.dim() != 2 or scale.shape[0] not in (1, end - start)
                                  or scale.shape[1] != x.shape[1]):
            _fail(_INIT, f"quant_mode 1: scale must be ({end - start} or 1, H={x.shape[1]}), got "
                         f"{tuple(scale.shape)}")
    elif scale is not None and (scale.dim() != 1 or scale.shape[0] != x.shape[0]):
        _fail(_INIT, f"scale must be 1-D (NUM_ROWS={x.shape[0]},) without quantisation, got {tuple(scale.shape)}")
    return start, end


def _out_rows(n, k, active_num):
    return n * k if active_num <= 0 else min(active_num, n * k)


def _count_shape(flag, count_type, start, end, expert_num):
    if not flag:
        return (0,)
    return (end - start,) if count_type in (0, 1) else (expert_num, 2)


@custom_op("npu::_moe_init_routing_v2", mutates_args=(), device_types="npu", schema=(
    "(Tensor x, Tensor expert_idx, Tensor? scale, Tensor? offset, int active_num, int expert_capacity, "
    "int expert_num, int drop_pad_mode, int expert_tokens_num_type, bool expert_tokens_num_flag, int quant_mode, "
    "int[] active_expert_range, int row_idx_type) -> (Tensor, Tensor, Tensor, Tensor)"))
def _moe_init_routing_v2(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num, drop_pad_mode,
                         expert_tokens_num_type, expert_tokens_num_flag, quant_mode, active_expert_range,
                         row_idx_type):
    start, end = _check_init(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num, drop_pad_mode,
                             expert_tokens_num_type, quant_mode, active_expert_range, row_idx_type)
    n, k = expert_idx.shape
    dev = x.device
    experts = expert_idx.reshape(-1).long()
    in_range = (experts >= start) & (experts < end)
    # stable sort by expert; pairs outside the range sort last (key end)
    order = torch.argsort(torch.where(in_range, experts, end), stable=True)
    available = int(in_range.sum())
    counts = torch.bincount(experts[in_range] - start, minlength=end - start)
    src = order[:available]
    if drop_pad_mode == 0:
        kept = min(available, _out_rows(n, k, active_num))
        slots_src, slot_pos = src[:kept], torch.arange(kept, device=dev)
        rows = _out_rows(n, k, active_num)
    else:
        cap = expert_capacity
        first = torch.cumsum(counts, 0) - counts  # each expert's first position in src
        rank = torch.arange(available, device=dev) - first[experts[src] - start]
        keep = rank < cap
        slots_src, slot_pos = src[keep], (experts[src] - start)[keep] * cap + rank[keep]
        kept = int(keep.sum())  # the counts stay the ones before dropping (CANN's histogram of the sort)
        rows = expert_num * cap
    tokens = slots_src // k
    gathered = x.index_select(0, tokens)
    expanded_scale = torch.zeros(rows, dtype=torch.float32, device=dev)
    if quant_mode == 1:
        rows_f = gathered.float()
        if scale is not None:
            smooth = scale.float()
            per_row = smooth[0] if smooth.shape[0] == 1 else smooth.index_select(0, experts[slots_src] - start)
            rows_f = rows_f * per_row
        s = rows_f.abs().amax(-1) / 127.0
        q = torch.round(rows_f / torch.where(s > 0, s, 1.0).unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
        gathered, out_dtype = q, torch.int8
        expanded_scale[slot_pos] = s
    else:
        out_dtype = x.dtype
        if scale is not None:
            expanded_scale[slot_pos] = scale.float().index_select(0, tokens)
    if drop_pad_mode == 0 and kept == rows:  # every slot filled, in order: the gather is the output
        expanded_x = gathered
    else:
        expanded_x = torch.zeros(rows, x.shape[1], dtype=out_dtype, device=dev)
        expanded_x[slot_pos] = gathered
    if drop_pad_mode == 1:
        expanded_x = expanded_x.view(expert_num, expert_capacity, x.shape[1])
    row_idx = torch.full((n * k,), -1, dtype=torch.int64, device=dev)
    if row_idx_type == 0:
        row_idx[slots_src] = slot_pos
    else:
        row_idx[:kept] = slots_src
    if not expert_tokens_num_flag:
        tokens_num = torch.zeros(0, dtype=torch.int64, device=dev)
    elif expert_tokens_num_type == 0:
        tokens_num = torch.cumsum(counts, 0)
    elif expert_tokens_num_type == 1:
        tokens_num = counts.clone()
    else:
        tokens_num = torch.zeros(expert_num, 2, dtype=torch.int64, device=dev)
        busy = counts.nonzero().squeeze(-1)
        tokens_num[: busy.numel(), 0] = busy + start
        tokens_num[: busy.numel(), 1] = counts[busy]
    return expanded_x, row_idx.to(torch.int32), tokens_num.to(torch.int64), expanded_scale


@_moe_init_routing_v2.register_fake
def _(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num, drop_pad_mode, expert_tokens_num_type,
      expert_tokens_num_flag, quant_mode, active_expert_range, row_idx_type):
    start, end = _check_init(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num, drop_pad_mode,
                             expert_tokens_num_type, quant_mode, active_expert_range, row_idx_type)
    n, k = expert_idx.shape
    dtype = torch.int8 if quant_mode == 1 else x.dtype
    if drop_pad_mode == 1:
        ex, rows = x.new_empty(expert_num, expert_capacity, x.shape[1], dtype=dtype), expert_num * expert_capacity
    else:
        rows = _out_rows(n, k, active_num)
        ex = x.new_empty(rows, x.shape[1], dtype=dtype)
    return (ex, x.new_empty(n * k, dtype=torch.int32),
            x.new_empty(_count_shape(expert_tokens_num_flag, expert_tokens_num_type, start, end, expert_num),
                        dtype=torch.int64),
            x.new_empty(rows, dtype=torch.float32))


def npu_moe_init_routing_v2(x, expert_idx, *, scale=None, offset=None, active_num=-1, expert_capacity=-1,
                            expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False,
                            quant_mode=-1, active_expert_range=(), row_idx_type=0, x_dtype=None):
    if x_dtype is not None:
        _fail(_INIT, "x_dtype (Ascend's non-native dtypes: hifloat8, float4) is not supported")
    return torch.ops.npu._moe_init_routing_v2(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num,
                                              drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag,
                                              quant_mode, list(active_expert_range or []), row_idx_type)


# ---- grouped matmul + finalize routing --------------------------------------------------------------------
def _check_finalize(x, w, group_list, scale, bias, offset, pertoken_scale, shared_input, logit, row_index, dtype,
                    shared_input_offset, output_bs, group_list_type):
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[1]:
        _fail(_FINALIZE, f"x (m, k) and weight (e, k, n) must agree on k, got {tuple(x.shape)} and {tuple(w.shape)}")
    if (x.dtype == torch.int8) != (w.dtype == torch.int8) or not (x.dtype == torch.int8 or x.is_floating_point()):
        _fail(_FINALIZE, f"x and weight must both be int8 (a8w8) or both floating, got {x.dtype} and {w.dtype} "
                         "(int4 weights, a8w4, are not supported)")
    e, _, n = w.shape
    m = x.shape[0]
    if group_list.dim() != 1 or group_list.shape[0] != e:
        _fail(_FINALIZE, f"group_list must be 1-D with one entry per expert ({e}), got {tuple(group_list.shape)}")
    if group_list_type not in (0, 1):
        _fail(_FINALIZE, f"group_list_type must be 0 (cumsum) or 1 (count), got {group_list_type}")
    if offset is not None:
        _fail(_FINALIZE, "offset (a8w4 quantisation) is not supported")
    if scale is not None and tuple(scale.shape) != (e, n):
        _fail(_FINALIZE, f"scale must be per-channel ({e}, {n}), got {tuple(scale.shape)}")
    if bias is not None and tuple(bias.shape) != (e, n):
        _fail(_FINALIZE, f"bias must be ({e}, {n}), got {tuple(bias.shape)}")
    for name, t in (("pertoken_scale", pertoken_scale), ("logit", logit), ("row_index", row_index)):
        if t is not None and tuple(t.shape) != (m,):
            _fail(_FINALIZE, f"{name} must be 1-D (m={m},), got {tuple(t.shape)}")
    rows = output_bs or m
    if output_bs < 0:
        _fail(_FINALIZE, f"output_bs must be >= 0, got {output_bs}")
    if shared_input is not None and (shared_input.dim() != 2 or shared_input.shape[1] != n
                                     or not 0 <= shared_input_offset <= rows - shared_input.shape[0]):
        _fail(_FINALIZE, f"shared_input (rows, n={n}) placed at shared_input_offset={shared_input_offset} must fit "
                         f"in the {rows} output rows, got {tuple(shared_input.shape)}")
    if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16):
        _fail(_FINALIZE, f"dtype must be float32, float16 or bfloat16, got {dtype}")
    return rows, n


@custom_op("npu::_grouped_matmul_finalize_routing", mutates_args=(), device_types="npu", schema=(
    "(Tensor x, Tensor w, Tensor group_list, Tensor? scale, Tensor? bias, Tensor? offset, Tensor? pertoken_scale, "
    "Tensor? shared_input, Tensor? logit, Tensor? row_index, ScalarType? dtype, float shared_input_weight, "
    "int shared_input_offset, int output_bs, int group_list_type) -> Tensor"))
def _grouped_matmul_finalize_routing(x, w, group_list, scale, bias, offset, pertoken_scale, shared_input, logit,
                                     row_index, dtype, shared_input_weight, shared_input_offset, output_bs,
                                     group_list_type):
    rows, n = _check_finalize(x, w, group_list, scale, bias, offset, pertoken_scale, shared_input, logit, row_index,
                              dtype, shared_input_offset, output_bs, group_list_type)
    sizes = group_list.long()
    if group_list_type == 0:  # cumulative ends -> sizes
        sizes = torch.diff(sizes, prepend=sizes.new_zeros(1))
    ends = torch.cumsum(sizes, 0).tolist()
    if ends and (ends[-1] > x.shape[0] or min(sizes.tolist()) < 0):
        _fail(_FINALIZE, f"group_list must describe non-negative groups covering at most the {x.shape[0]} rows, "
                         f"got {group_list.tolist()}")
    acc = torch.float64 if torch.float64 in (x.dtype, w.dtype) else torch.float32
    # int8 products summed over k are exact in float64 (|sum| < 2^53), as Ascend's int32 accumulation
    mm_dtype = torch.float64 if x.dtype == torch.int8 else acc
    out = torch.zeros(rows, n, dtype=acc, device=x.device)
    if shared_input is not None:
        out[shared_input_offset: shared_input_offset + shared_input.shape[0]] += (
            shared_input.to(acc) * shared_input_weight)
    begin = 0
    for g, end in enumerate(ends):
        if end == begin:
            continue
        y = (x[begin:end].to(mm_dtype) @ w[g].to(mm_dtype)).to(acc)
        if scale is not None:
            y = y * scale[g].to(acc)
        if pertoken_scale is not None:
            y = y * pertoken_scale[begin:end].to(acc).unsqueeze(-1)
        if bias is not None:
            y = y + bias[g].to(acc)
        if logit is not None:
            y = y * logit[begin:end].to(acc).unsqueeze(-1)
        dst = row_index[begin:end].long() if row_index is not None else torch.arange(begin, end, device=x.device)
        out.index_add_(0, dst, y)
        begin = end
    return out.to(dtype or torch.float32)


@_grouped_matmul_finalize_routing.register_fake
def _(x, w, group_list, scale, bias, offset, pertoken_scale, shared_input, logit, row_index, dtype,
      shared_input_weight, shared_input_offset, output_bs, group_list_type):
    rows, n = _check_finalize(x, w, group_list, scale, bias, offset, pertoken_scale, shared_input, logit, row_index,
                              dtype, shared_input_offset, output_bs, group_list_type)
    return x.new_empty(rows, n, dtype=dtype or torch.float32)


def npu_grouped_matmul_finalize_routing(x, w, group_list, *, scale=None, bias=None, offset=None, pertoken_scale=None,
                                        shared_input=None, logit=None, row_index=None, dtype=None,
                                        shared_input_weight=1.0, shared_input_offset=0, output_bs=0,
                                        group_list_type=1, tuning_config=None, x_dtype=None, w_dtype=None,
                                        scale_dtype=None, pertoken_scale_dtype=None):
    if any(d is not None for d in (x_dtype, w_dtype, scale_dtype, pertoken_scale_dtype)):
        _fail(_FINALIZE, "x_dtype/w_dtype/scale_dtype/pertoken_scale_dtype (hifloat8, float4, float8_e8m0 "
                         "operands) are not supported")
    # tuning_config is a tiling hint for Ascend's kernel: no effect on the result
    return torch.ops.npu._grouped_matmul_finalize_routing(
        x, w, group_list, scale, bias, offset, pertoken_scale, shared_input, logit, row_index, dtype,
        1.0 if shared_input_weight is None else shared_input_weight, shared_input_offset or 0, output_bs or 0,
        1 if group_list_type is None else group_list_type)


_lib = torch.library.Library("npu", "FRAGMENT")
for _name, _schema, _fn in (
        (_INIT, "(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, int active_num=-1, "
         "int expert_capacity=-1, int expert_num=-1, int drop_pad_mode=0, int expert_tokens_num_type=0, "
         "bool expert_tokens_num_flag=False, int quant_mode=-1, int[2] active_expert_range=[], int row_idx_type=0, "
         "int? x_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)", npu_moe_init_routing_v2),
        (_FINALIZE, "(Tensor x, Tensor w, Tensor group_list, *, Tensor? scale=None, Tensor? bias=None, "
         "Tensor? offset=None, Tensor? pertoken_scale=None, Tensor? shared_input=None, Tensor? logit=None, "
         "Tensor? row_index=None, ScalarType? dtype=None, float? shared_input_weight=1.0, "
         "int? shared_input_offset=0, int? output_bs=0, int? group_list_type=1, int[]? tuning_config=None, "
         "int? x_dtype=None, int? w_dtype=None, int? scale_dtype=None, int? pertoken_scale_dtype=None) -> Tensor",
         npu_grouped_matmul_finalize_routing)):
    _lib.define(_name + _schema)
    # Composite: tracing sees the positional kernel it decomposes into (custom ops take no keyword-only tensors).
    _lib.impl(_name, _fn, "CompositeImplicitAutograd")


# ---- the first inference routing trio: init_routing -> experts -> finalize_routing, compute_expert_tokens -----------------------------------------
def _check_init_routing(x, row_idx, expert_idx, active_num):
    op = "npu_moe_init_routing"
    if x.dim() != 2 or expert_idx.dim() != 2 or expert_idx.shape[0] != x.shape[0]:
        _fail(op, f"x (NUM_ROWS, H) and expert_idx (NUM_ROWS, K) must be 2-D with equal rows, got "
                  f"{tuple(x.shape)} and {tuple(expert_idx.shape)}")
    if tuple(row_idx.shape) != tuple(expert_idx.shape):
        _fail(op, f"row_idx must have expert_idx's shape {tuple(expert_idx.shape)}, got {tuple(row_idx.shape)}")
    if active_num < 0:
        _fail(op, f"active_num must be >= 0, got {active_num}")
    return min(x.shape[0], active_num) * expert_idx.shape[1]


@custom_op("npu::npu_moe_init_routing", mutates_args=(), device_types="npu",
           schema="(Tensor x, Tensor row_idx, Tensor expert_idx, int active_num) -> (Tensor, Tensor, Tensor)")
def npu_moe_init_routing(x, row_idx, expert_idx, active_num):
    rows = _check_init_routing(x, row_idx, expert_idx, active_num)
    experts, rids = expert_idx.reshape(-1).long(), row_idx.reshape(-1).long()
    # key-value sort of (expert, row index): equal experts keep their rows in ascending row_idx order
    order = torch.argsort(experts * (rids.numel() + 1) + rids, stable=True)
    sorted_rows = rids[order]
    expanded_row_idx = torch.empty_like(sorted_rows).scatter_(
        0, sorted_rows, torch.arange(sorted_rows.numel(), device=x.device))
    expanded_x = x.index_select(0, sorted_rows[:rows] % x.shape[0])
    return expanded_x, expanded_row_idx.to(torch.int32), experts[order].to(expert_idx.dtype)


@npu_moe_init_routing.register_fake
def _(x, row_idx, expert_idx, active_num):
    rows = _check_init_routing(x, row_idx, expert_idx, active_num)
    n = expert_idx.numel()
    return x.new_empty(rows, x.shape[1]), x.new_empty(n, dtype=torch.int32), expert_idx.new_empty(n)


def _check_finalize_routing(rows, skip1, skip2, bias, scales, src_to_dst, expert_for_row, drop_pad_mode, k):
    op = "npu_moe_finalize_routing"
    if drop_pad_mode not in (None, 0):
        _fail(op, f"drop_pad_mode must be 0 (the only mode Ascend documents), got {drop_pad_mode}")
    if skip2 is not None and skip1 is None:
        _fail(op, "skip2 needs skip1 (Ascend: when skip2 is None skip1 must be None too, so pass skip1 first)")
    kk = scales.shape[1] if scales is not None else (k or 1)
    if rows.dim() != 2 or src_to_dst.dim() != 1 or src_to_dst.numel() % kk or src_to_dst.numel() != rows.shape[0]:
        _fail(op, f"expanded_permuted_rows (NUM_ROWS*K, H) and expanded_src_to_dst_row (NUM_ROWS*K,) must match "
                  f"with K={kk}, got {tuple(rows.shape)} and {tuple(src_to_dst.shape)}")
    n = src_to_dst.numel() // kk
    if bias is not None and (expert_for_row is None or tuple(expert_for_row.shape) != (n, kk)):
        _fail(op, f"bias needs export_for_source_row of shape ({n}, {kk})")
    for name, t in (("skip1", skip1), ("skip2", skip2)):
        if t is not None and tuple(t.shape) != (n, rows.shape[1]):
            _fail(op, f"{name} must have shape ({n}, {rows.shape[1]}), got {tuple(t.shape)}")
    return n, kk


@custom_op("npu::npu_moe_finalize_routing", mutates_args=(), device_types="npu", schema=(
    "(Tensor expanded_permuted_rows, Tensor? skip1, Tensor? skip2, Tensor? bias, Tensor? scales, "
    "Tensor expanded_src_to_dst_row, Tensor? export_for_source_row, int? drop_pad_mode=0, int? k=1) -> Tensor"))
def npu_moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                             export_for_source_row, drop_pad_mode=0, k=1):
    n, kk = _check_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                            export_for_source_row, drop_pad_mode, k)
    acc = _acc_dtype(expanded_permuted_rows)
    # pair (i, k) of the output reads expanded_src_to_dst_row[i + k * NUM_ROWS]
    dst = expanded_src_to_dst_row.long().view(kk, n).t()
    rows = expanded_permuted_rows.to(acc).index_select(0, dst.reshape(-1)).view(n, kk, -1)
    if bias is not None:
        rows = rows + bias.to(acc).index_select(0, export_for_source_row.long().reshape(-1)).view(n, kk, -1)
    if scales is not None:
        rows = rows * scales.to(acc).unsqueeze(-1)
    out = rows.sum(1)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.to(acc)
    return out.to(expanded_permuted_rows.dtype)


@npu_moe_finalize_routing.register_fake
def _(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row, export_for_source_row,
      drop_pad_mode=0, k=1):
    n, _ = _check_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                           export_for_source_row, drop_pad_mode, k)
    return expanded_permuted_rows.new_empty(n, expanded_permuted_rows.shape[1])


def _check_expert_tokens(sorted_experts, num_expert):
    if sorted_experts.dim() != 1 or sorted_experts.dtype not in (torch.int32, torch.int64):
        _fail("npu_moe_compute_expert_tokens", f"sorted_expert_for_source_row must be a 1-D int32 tensor, got "
                                               f"{sorted_experts.dtype} {tuple(sorted_experts.shape)}")
    if not 0 < num_expert <= 2048:
        _fail("npu_moe_compute_expert_tokens", f"num_expert must be in (0, 2048], got {num_expert}")


@custom_op("npu::npu_moe_compute_expert_tokens", mutates_args=(), device_types="npu",
           schema="(Tensor sorted_expert_for_source_row, int num_expert) -> Tensor")
def npu_moe_compute_expert_tokens(sorted_expert_for_source_row, num_expert):
    """expert_tokens[i] = the end (exclusive) of expert i's rows: a binary search over the sorted experts."""
    _check_expert_tokens(sorted_expert_for_source_row, num_expert)
    experts = torch.arange(num_expert, device=sorted_expert_for_source_row.device,
                           dtype=sorted_expert_for_source_row.dtype)
    return torch.searchsorted(sorted_expert_for_source_row, experts, right=True).to(
        sorted_expert_for_source_row.dtype)


@npu_moe_compute_expert_tokens.register_fake
def _(sorted_expert_for_source_row, num_expert):
    _check_expert_tokens(sorted_expert_for_source_row, num_expert)
    return sorted_expert_for_source_row.new_empty(num_expert)
