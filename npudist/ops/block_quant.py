"""torch_npu's block-wise dynamic int8 quantisation and its grouped float8 quantisation with the absolute maximum,
each the aten composition of its documented math (fake tensors and compile come from the aten ops, and a fake
kernel for the grouped quantisation, which reads group_list's values; both are inference operators without a
backward).

* ``npu_dynamic_block_quant(x, *, min_scale=0.0, round_mode="rint", dst_type=1, row_block_size=1,
  col_block_size=128, dst_type_max=0.0) -> (y, scale)``: ``x`` (M, N) or (B, M, N) is cut into blocks of
  ``row_block_size`` x ``col_block_size`` over its last two dims (the last block of a dim may be short); per
  block ``scale = max(max|block| / 127, min_scale)`` and ``y = round(x / scale)`` as int8 (round half to even,
  saturated; a block of zeros gives scale 0 and y 0). ``scale`` is float32 of shape
  (ceil(M / row_block_size), ceil(N / col_block_size)) (with B in front for 3-D x). ``min_scale`` is the lower
  bound the page describes ("the minimum scale taking part in the scale computation").
* ``npu_quant_max(x, scale, *, round_mode="rint", dst_dtype=291, group_list=None) -> (y, amax)``: without
  ``group_list`` (or with one entry) ``y = cast(x * scale[0])`` and ``amax = [max|x|]``; with ``group_list``
  (cumulative row ends along dim 0, ``G`` entries) group ``g`` is rows ``group_list[g-1]:group_list[g]`` (from 0
  for g = 0): ``y = cast(x_g * scale[g])`` and ``amax[g] = max|x_g|`` (0 for an empty group). ``dst_dtype`` is
  torch_npu's enum (291 float8_e5m2, 292 float8_e4m3fn; torch's ScalarType numbers 23 / 24 and the torch dtypes
  themselves are accepted too, as the ScalarType numbers they pass as); the cast rounds to nearest even and
  saturates at the format's largest finite value (the quantisation convention of npudist.ops.quant), NaN stays
  NaN. ``amax`` has x's dtype.

Refused with a ValueError naming the argument: ``dst_type`` other than 1 (int8, the one value the page supports)
and ``dst_type_max`` other than 0.0 (no formula given), ``round_mode`` other than "rint"; for ``npu_quant_max``
hifloat8 (290, with its "round" / "hybrid" modes: an Ascend 8-bit format without a torch dtype or a documented
bit layout), and a ``group_list`` whose last end is not x's row count (rows outside every group have no value).
"""
from __future__ import annotations

import torch
from torch.library import custom_op

from npudist.ops.quant import _saturate

_FLOAT8 = {291: torch.float8_e5m2, 292: torch.float8_e4m3fn, 23: torch.float8_e5m2, 24: torch.float8_e4m3fn}


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _block_args(op, x, round_mode, dst_type, row_block_size, col_block_size, dst_type_max):
    if x.dim() not in (2, 3):
        _fail(op, f"x must be 2-D (M, N) or 3-D (B, M, N), got {tuple(x.shape)}")
    if not x.is_floating_point():
        _fail(op, f"x must be floating point (float16 / bfloat16 / float32), got {x.dtype}")
    if round_mode != "rint":
        _fail(op, f"round_mode must be 'rint' (the only documented mode), got {round_mode!r}")
    if dst_type != 1:
        _fail(op, f"dst_type must be 1 (int8, the only documented output), got {dst_type}")
    if dst_type_max != 0.0:
        _fail(op, f"dst_type_max must be 0.0 (no formula is documented for other values), got {dst_type_max}")
    if row_block_size < 1 or col_block_size < 1:
        _fail(op, f"row_block_size and col_block_size must be positive, got {row_block_size}, {col_block_size}")


def npu_dynamic_block_quant(x, *, min_scale=0.0, round_mode="rint", dst_type=1, row_block_size=1,
                            col_block_size=128, dst_type_max=0.0):
    op = "npu_dynamic_block_quant"
    _block_args(op, x, round_mode, dst_type, row_block_size, col_block_size, dst_type_max)
    if min_scale < 0:
        _fail(op, f"min_scale must be >= 0, got {min_scale}")
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    b, m, n = x3.shape
    mb, nb = -(-m // row_block_size), -(-n // col_block_size)
    pad = torch.nn.functional.pad(x3.float(), (0, nb * col_block_size - n, 0, mb * row_block_size - m))
    blocks = pad.reshape(b, mb, row_block_size, nb, col_block_size)
    scale = (blocks.abs().amax((2, 4)) / 127).clamp_min(min_scale)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = blocks / safe[:, :, None, :, None]
    y = _saturate(q, -128, 127).to(torch.int8).reshape(b, mb * row_block_size, nb * col_block_size)[:, :m, :n]
    if x.dim() == 2:
        y, scale = y[0], scale[0]
    return y.contiguous(), scale


def _float8(op, dst_dtype, round_mode):
    if dst_dtype == 290:
        _fail(op, "dst_dtype hifloat8 (290) has no torch dtype and no documented bit layout; use 291 "
                  "(float8_e5m2) or 292 (float8_e4m3fn)")
    dtype = _FLOAT8.get(dst_dtype)
    if dtype is None:
        _fail(op, f"dst_dtype must be 291 / torch.float8_e5m2 or 292 / torch.float8_e4m3fn, got {dst_dtype}")
    if round_mode != "rint":
        _fail(op, f"round_mode must be 'rint' for float8 outputs (round / hybrid are hifloat8's), got {round_mode!r}")
    return dtype


def _cast_float8(v, dtype):
    top = torch.finfo(dtype).max
    return v.clamp(-top, top).to(dtype)  # clamp keeps NaN


# The grouped form reads group_list's values, so the kernel is an opaque operator with a fake kernel (the public
# operator takes group_list keyword-only, which custom_op does not allow for tensors).
@custom_op("npu::_quant_max", mutates_args=(), device_types="npu",
           schema="(Tensor x, Tensor scale, str round_mode, int dst_dtype, Tensor? group_list) -> (Tensor, Tensor)")
def _quant_max(x, scale, round_mode, dst_dtype, group_list):
    op = "npu_quant_max"
    dtype = _float8(op, dst_dtype, round_mode)
    if not x.is_floating_point() or x.dim() == 0:
        _fail(op, f"x must be a floating point tensor with at least one dim, got {x.dtype} {tuple(x.shape)}")
    groups = 1 if group_list is None else max(group_list.shape[0], 1)
    if scale.dim() != 1 or scale.shape[0] != groups:
        _fail(op, f"scale must be 1-D with one entry per group ({groups}), got {tuple(scale.shape)}")
    xf = x.float()
    if groups == 1:
        return _cast_float8(xf * scale.float()[0], dtype), x.abs().amax().reshape(1)
    if group_list.dim() != 1 or group_list.dtype not in (torch.int32, torch.int64):
        _fail(op, f"group_list must be a 1-D int64 tensor of cumulative row ends, got {group_list.dtype} "
                  f"{tuple(group_list.shape)}")
    ends = group_list.tolist()
    if any(b < a for a, b in zip([0] + ends, ends)) or ends[-1] != x.shape[0]:
        _fail(op, f"group_list must be non-decreasing cumulative row ends ending at x's {x.shape[0]} rows, "
                  f"got {ends}")
    sizes = torch.tensor([b - a for a, b in zip([0] + ends, ends)], device=x.device)
    row_group = torch.repeat_interleave(torch.arange(groups, device=x.device), sizes)
    per_row = scale.float()[row_group].reshape(-1, *([1] * (x.dim() - 1)))
    y = _cast_float8(xf * per_row, dtype)
    flat = x.abs().reshape(x.shape[0], -1).amax(1) if x.numel() else x.new_zeros(x.shape[0])
    # |x| >= 0, so starting from zeros gives each group its maximum and an empty group 0
    amax = x.new_zeros(groups).scatter_reduce_(0, row_group, flat, "amax")
    return y, amax


@_quant_max.register_fake
def _(x, scale, round_mode, dst_dtype, group_list):
    dtype = _float8("npu_quant_max", dst_dtype, round_mode)
    groups = 1 if group_list is None else max(group_list.shape[0], 1)
    return torch.empty_like(x, dtype=dtype), x.new_empty(groups)


def npu_quant_max(x, scale, *, round_mode="rint", dst_dtype=291, group_list=None):
    # a torch dtype passed for dst_dtype arrives as its ScalarType number (23 / 24)
    return torch.ops.npu._quant_max(x, scale, round_mode, dst_dtype, group_list)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_dynamic_block_quant(Tensor x, *, float min_scale=0.0, str round_mode=\"rint\", int dst_type=1, "
            "int row_block_size=1, int col_block_size=128, float dst_type_max=0.0) -> (Tensor y, Tensor scale)")
_lib.impl("npu_dynamic_block_quant", npu_dynamic_block_quant, "CompositeImplicitAutograd")
_lib.define("npu_quant_max(Tensor x, Tensor scale, *, str round_mode=\"rint\", int dst_dtype=291, "
            "Tensor? group_list=None) -> (Tensor, Tensor)")
_lib.impl("npu_quant_max", npu_quant_max, "CompositeImplicitAutograd")
