"""torch_npu's dynamic MX (microscaling) quantisation to float8, ``npu_dynamic_mx_quant`` and its dual-axis form
(aten ops: fake tensors and compile come from them) and ``npu_grouped_dynamic_mx_quant`` (an opaque operator
with a fake kernel: its layout follows group_index's values). Quantisers without a backward.

``npu_dynamic_mx_quant(input, *, axis=-1, round_mode="rint", dst_type=..., block_size=32, scale_alg=0, ...)`` with
``dst_type`` 291 (float8_e5m2) or 292 (float8_e4m3fn) (torch's dtypes pass as their ScalarType numbers 23 / 24,
also accepted): along the last dim, each run of ``block_size`` elements (the last one may be short) shares a
power-of-two scale ``X = 2^E``: ``scale_alg`` 0 (the OCP MX specification) ``E = floor(log2(max|block|)) - emax``
with ``emax`` the element format's largest exponent (8 for e4m3fn, 15 for e5m2); ``scale_alg`` 1 (cuBLAS's, as
npu_grouped_dynamic_mx_quant's page defines it) ``E = ceil(log2(max(max|block|, max_low_bound) / Amax(DType)))``
in float32 (``Amax``: 448 / 57344). ``E`` is clamped to e8m0's [-127, 127] (an all-zero block gets -127);
``y = cast(block / X)``, rounding to nearest even and saturating at the format's largest finite value (NaN stays
NaN). ``mxscale`` holds the e8m0 codes (``E + 127``) as uint8, of shape ``input.shape[:-1] + (ceil(blocks / 2),
2)``: consecutive blocks in pairs, an odd block count padded with a code 0. Along another ``axis`` the blocks run
along that dim and the scales are "interleaved in pairs of rows": ``mxscale`` has input's shape with ``axis``
replaced by the pair count and a last dim of 2, ``[..., p, ..., 0 / 1]`` = blocks ``2p`` / ``2p + 1`` (for a 2-D
input and axis 0: (ceil(M / 64), N, 2), the layout npu_dynamic_mx_quant_with_dual_axis gives its -2 axis).

``npu_dynamic_mx_quant_with_dual_axis(input, *, round_mode="rint", dst_type=296, scale_alg=0, dst_type_max=0.0)
-> (y1, mxscale1, y2, mxscale2)``: both at once with 32-element blocks, along the last dim (y1, mxscale1
(..., M, ceil(N / 64), 2)) and along the second to last (y2, mxscale2 (..., ceil(M / 64), N, 2)).

``npu_grouped_dynamic_mx_quant(x, group_index, *, round_mode="rint", dst_type=23, blocksize=32, scale_alg=0,
dst_type_max=0.0)``: ``x`` (m, n) split along dim 0 into the groups ``group_index`` (cumulative row ends) gives;
within each group, runs of ``blocksize`` (32) rows (the group's last may be short) share one scale per column,
by the same rules. ``mxscale`` is (m // 64 + g, n, 2) uint8: each group's blocks, padded to an even count with
code 0, in pairs ``[p, column, 0 / 1]`` = blocks ``2p`` / ``2p + 1``, the groups one after another; rows left
after the last group stay 0 (the page sizes the output for the worst case).

Refused with a ValueError naming the argument: the float4 targets (296 / 297, the default: the page does not say
in which nibble of the uint8 each of the two values goes), ``scale_alg`` 2 (float4 only), ``round_mode`` other
than "rint" (the only mode for float8), ``dst_type_max`` other than 0.0 (float4 only).
"""
from __future__ import annotations

import torch
from torch.library import custom_op

from npudist.ops.block_quant import _cast_float8

_OP = "npu_dynamic_mx_quant"
_FLOAT8 = {291: torch.float8_e5m2, 292: torch.float8_e4m3fn, 23: torch.float8_e5m2, 24: torch.float8_e4m3fn}
_EMAX = {torch.float8_e5m2: 15, torch.float8_e4m3fn: 8}


def _fail(msg):
    raise ValueError(f"{_OP}: {msg}")


def npu_dynamic_mx_quant(input, *, axis=-1, round_mode="rint", dst_type=296, block_size=32, scale_alg=0,
                         dst_type_max=0.0, max_low_bound=0.0):
    if dst_type in (296, 297):
        _fail(f"dst_type {dst_type} (float4) is not supported: the page does not say which nibble of the packed "
              f"uint8 holds which value; use 291 (float8_e5m2) or 292 (float8_e4m3fn)")
    dtype = _FLOAT8.get(dst_type)
    if dtype is None:
        _fail(f"dst_type must be 291 / torch.float8_e5m2 or 292 / torch.float8_e4m3fn, got {dst_type}")
    if input.dim() == 0 or not input.is_floating_point():
        _fail(f"input must be a floating tensor with at least one dim, got {input.dtype} {tuple(input.shape)}")
    if not -input.dim() <= axis < input.dim():
        _fail(f"axis {axis} is out of range for a {input.dim()}-D input")
    if round_mode != "rint":
        _fail(f"round_mode must be 'rint' (the only mode for float8 targets), got {round_mode!r}")
    if scale_alg not in (None, 0, 1):
        _fail(f"scale_alg must be 0 (OCP) or 1 (cuBLAS) for float8 targets, got {scale_alg}")
    if dst_type_max != 0.0:
        _fail(f"dst_type_max must be 0.0 (it applies to float4 targets only), got {dst_type_max}")
    if max_low_bound < 0 or (max_low_bound != 0.0 and scale_alg != 1):
        _fail(f"max_low_bound must be >= 0, and 0.0 unless scale_alg is 1, got {max_low_bound}")
    if block_size <= 0 or block_size % 32 or block_size > 1024:
        _fail(f"block_size must be a multiple of 32 in [32, 1024], got {block_size}")
    # quantise along the last dim of the input with axis moved last; the scales' pair dim then takes axis's place
    y, codes = _quantize_last(input.movedim(axis, -1), dtype, block_size, scale_alg or 0, max_low_bound)
    return y.movedim(-1, axis).contiguous(), codes.movedim(-2, axis % input.dim()).contiguous()


def _quantize_last(x, dtype, block_size, scale_alg, max_low_bound=0.0):
    """(y, e8m0 codes (..., ceil(blocks / 2), 2)) of MX quantisation along x's last dim."""
    n = x.shape[-1]
    blocks = -(-n // block_size)
    padded = torch.nn.functional.pad(x.float(), (0, blocks * block_size - n))
    grouped = padded.reshape(*x.shape[:-1], blocks, block_size)
    exponent = mx_exponents(grouped.abs().amax(-1), dtype, scale_alg, max_low_bound)
    y = _cast_float8((grouped.double() / torch.pow(2.0, exponent.double()).unsqueeze(-1)).float(), dtype)
    y = y.reshape(*x.shape[:-1], blocks * block_size)[..., :n]
    codes = torch.nn.functional.pad((exponent + 127).to(torch.uint8), (0, blocks % 2))
    return y, codes.reshape(*x.shape[:-1], -1, 2)


def _float8_target(fail, dst_type):
    """The float8 dtype of a dst_type code (the dual-axis and grouped pages' numbering); float4 codes are refused."""
    if dst_type in (296, 297):
        fail(f"dst_type {dst_type} (float4) is not supported: the page does not say which nibble of the packed uint8 "
             f"holds which value; use 23 (float8_e5m2) or 24 (float8_e4m3fn)")
    dtype = _FLOAT8.get(dst_type)
    if dtype is None:
        fail(f"dst_type must be 23 / torch.float8_e5m2 or 24 / torch.float8_e4m3fn, got {dst_type}")
    return dtype


_DUAL = "npu_dynamic_mx_quant_with_dual_axis"


def npu_dynamic_mx_quant_with_dual_axis(input, *, round_mode="rint", dst_type=296, scale_alg=0, dst_type_max=0.0):
    def fail(msg):
        raise ValueError(f"{_DUAL}: {msg}")
    dtype = _float8_target(fail, dst_type)
    if not 2 <= input.dim() <= 7 or not input.is_floating_point():
        fail(f"input must be a floating tensor of 2 to 7 dims, got {input.dtype} {tuple(input.shape)}")
    if round_mode != "rint":
        fail(f"round_mode must be 'rint' (the only mode for float8 targets), got {round_mode!r}")
    if scale_alg not in (0, 1):
        fail(f"scale_alg must be 0 (OCP) or 1 (cuBLAS) for float8 targets, got {scale_alg}")
    if dst_type_max not in (None, 0.0):
        fail(f"dst_type_max must be 0.0 (it applies to float4 targets only), got {dst_type_max}")
    y1, s1 = _quantize_last(input, dtype, 32, scale_alg)
    y2, s2 = _quantize_last(input.transpose(-1, -2), dtype, 32, scale_alg)
    return y1.contiguous(), s1, y2.transpose(-1, -2).contiguous(), s2.movedim(-2, -3).contiguous()


def mx_exponents(amax, dtype, scale_alg, max_low_bound=0.0):
    """int32 log2 of each block's MX scale, clamped to e8m0's [-127, 127] (an all-zero block: -127).

    scale_alg 0 (OCP): ``floor(log2(amax)) - emax``. scale_alg 1 (cuBLAS): ``ceil(log2(amax / Amax(DType)))``
    with the quotient in float32 and ``amax`` raised to ``max_low_bound``.
    """
    if scale_alg == 0:
        # floor(log2(amax)) exactly: frexp's exponent e has amax = m * 2^e with m in [0.5, 1)
        exponent = torch.frexp(amax).exponent.to(torch.int32) - 1 - _EMAX[dtype]
        zero = amax == 0
    else:
        ratio = amax.float().clamp_min(max_low_bound) / torch.finfo(dtype).max
        frac, exp = torch.frexp(ratio)
        exponent = exp.to(torch.int32) - (frac == 0.5).to(torch.int32)  # ceil(log2): exact powers of 2 stay
        zero = ratio == 0
    return torch.where(zero, torch.full_like(exponent, -127), exponent).clamp(-127, 127)


_GROUPED = "npu_grouped_dynamic_mx_quant"


def _grouped_args(x, group_index, round_mode, dst_type, blocksize, scale_alg, dst_type_max):
    def fail(msg):
        raise ValueError(f"{_GROUPED}: {msg}")
    dtype = _float8_target(fail, dst_type)
    if x.dim() != 2 or not x.is_floating_point():
        fail(f"x must be a 2-D floating tensor, got {x.dtype} {tuple(x.shape)}")
    if group_index.dim() != 1 or group_index.numel() == 0 or group_index.is_floating_point():
        fail(f"group_index must be a non-empty 1-D integer tensor, got {group_index.dtype} {tuple(group_index.shape)}")
    if round_mode != "rint":
        fail(f"round_mode must be 'rint' (the only mode for float8), got {round_mode!r}")
    if blocksize != 32:
        fail(f"blocksize must be 32 (the only documented value), got {blocksize}")
    if scale_alg not in (None, 0, 1):
        fail(f"scale_alg must be 0 (OCP) or 1 (cuBLAS) for float8 targets, got {scale_alg}")
    if dst_type_max not in (None, 0.0):
        fail(f"dst_type_max must be 0.0 (it applies to float4 targets only), got {dst_type_max}")
    return dtype


# The groups' row ranges are group_index's values, so the kernel is opaque with a fake kernel of the static shapes.
@custom_op("npu::npu_grouped_dynamic_mx_quant", mutates_args=(), device_types="npu", schema=(
    "(Tensor x, Tensor group_index, *, str round_mode=\"rint\", int dst_type=23, int blocksize=32, "
    "int? scale_alg=0, float? dst_type_max=0.0) -> (Tensor, Tensor)"))
def npu_grouped_dynamic_mx_quant(x, group_index, *, round_mode="rint", dst_type=23, blocksize=32, scale_alg=0,
                                 dst_type_max=0.0):
    dtype = _grouped_args(x, group_index, round_mode, dst_type, blocksize, scale_alg, dst_type_max)
    m, n = x.shape
    ends = [int(e) for e in group_index.tolist()]
    if any(b < a for a, b in zip([0] + ends, ends)) or ends[-1] != m:
        raise ValueError(f"{_GROUPED}: group_index must be non-decreasing cumulative row ends finishing at x's {m} "
                         f"rows, got {ends}")
    y = torch.empty(m, n, dtype=dtype, device=x.device)
    codes = torch.zeros(m // (2 * blocksize) + len(ends), n, 2, dtype=torch.uint8, device=x.device)
    row = 0
    for start, end in zip([0] + ends, ends):
        rows = end - start
        if rows == 0:
            continue
        blocks = -(-rows // blocksize)
        padded = torch.nn.functional.pad(x[start:end].float(), (0, 0, 0, blocks * blocksize - rows))
        grouped = padded.reshape(blocks, blocksize, n)
        exponent = mx_exponents(grouped.abs().amax(1), dtype, scale_alg or 0)  # (blocks, n)
        q = _cast_float8((grouped.double() / torch.pow(2.0, exponent.double()).unsqueeze(1)).float(), dtype)
        y[start:end] = q.reshape(blocks * blocksize, n)[:rows]
        pairs = torch.nn.functional.pad((exponent + 127).to(torch.uint8), (0, 0, 0, blocks % 2))
        codes[row:row + pairs.shape[0] // 2] = pairs.reshape(-1, 2, n).transpose(1, 2)
        row += pairs.shape[0] // 2
    return y, codes


@npu_grouped_dynamic_mx_quant.register_fake
def _(x, group_index, *, round_mode="rint", dst_type=23, blocksize=32, scale_alg=0, dst_type_max=0.0):
    dtype = _grouped_args(x, group_index, round_mode, dst_type, blocksize, scale_alg, dst_type_max)
    m, n = x.shape
    return (x.new_empty(m, n, dtype=dtype),
            x.new_empty(m // (2 * blocksize) + group_index.shape[0], n, 2, dtype=torch.uint8))


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_dynamic_mx_quant(Tensor input, *, int axis=-1, str round_mode=\"rint\", int dst_type=296, "
            "int block_size=32, int? scale_alg=0, float dst_type_max=0.0, float max_low_bound=0.0) -> (Tensor, Tensor)")
_lib.impl("npu_dynamic_mx_quant", npu_dynamic_mx_quant, "CompositeImplicitAutograd")
_lib.define("npu_dynamic_mx_quant_with_dual_axis(Tensor input, *, str round_mode=\"rint\", int dst_type=296, "
            "int scale_alg=0, float? dst_type_max=0.0) -> (Tensor, Tensor, Tensor, Tensor)")
_lib.impl("npu_dynamic_mx_quant_with_dual_axis", npu_dynamic_mx_quant_with_dual_axis, "CompositeImplicitAutograd")
