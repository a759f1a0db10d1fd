"""torch_npu's dynamic MX (microscaling) quantisation to float8, ``npu_dynamic_mx_quant``, as aten ops (fake
tensors and compile come from them; an inference / low-precision training operator without a backward).

``npu_dynamic_mx_quant(input, *, axis=-1, round_mode="rint", dst_type=..., block_size=32, scale_alg=0, ...)`` with
``dst_type`` 291 (float8_e5m2) or 292 (float8_e4m3fn) (torch's dtypes pass as their ScalarType numbers 23 / 24,
also accepted): along the last dim, each run of ``block_size`` elements (the last one may be short) shares the
OCP MX scale (``scale_alg`` 0, "OCP Mx Specification"): ``X = 2^(floor(log2(max|block|)) - emax)`` with ``emax``
the element format's largest exponent (8 for e4m3fn, 15 for e5m2), clamped to e8m0's [2^-127, 2^127] (an all-zero
block gets 2^-127); ``y = cast(block / X)``, rounding to nearest even and saturating at the format's largest finite
value (NaN stays NaN). ``mxscale`` holds the e8m0 codes (``log2(X) + 127``) as uint8, of shape
``input.shape[:-1] + (ceil(blocks / 2), 2)``: consecutive blocks in pairs, an odd block count padded with a code 0.

Refused with a ValueError naming the argument: the float4 targets (296 / 297, the default: the page does not say
in which nibble of the uint8 each of the two values goes), ``axis`` other than the last dim (its mxscale rows are
"interleaved in pairs" in an undescribed order), ``scale_alg`` 1 / 2 (cuBLAS / FP4 scale algorithms with no formula
on the page), ``round_mode`` other than "rint" (the only mode for float8), ``dst_type_max`` and ``max_low_bound``
other than 0.0 (documented only for the refused float4 target / scale_alg 1).
"""
from __future__ import annotations

import torch

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
    if axis not in (-1, input.dim() - 1):
        _fail(f"axis must be the last dim (-1): the page does not describe the interleaved mxscale of other axes, "
              f"got {axis}")
    if round_mode != "rint":
        _fail(f"round_mode must be 'rint' (the only mode for float8 targets), got {round_mode!r}")
    if scale_alg not in (None, 0):
        _fail(f"scale_alg must be 0 (the OCP MX scale): the page gives no formula for {scale_alg}")
    if dst_type_max != 0.0 or max_low_bound != 0.0:
        _fail(f"dst_type_max and max_low_bound must be 0.0 for float8 with scale_alg 0, got {dst_type_max} and "
              f"{max_low_bound}")
    if block_size <= 0 or block_size % 32 or block_size > 1024:
        _fail(f"block_size must be a multiple of 32 in [32, 1024], got {block_size}")
    n = input.shape[-1]
    blocks = -(-n // block_size)
    padded = torch.nn.functional.pad(input.float(), (0, blocks * block_size - n))
    grouped = padded.reshape(*input.shape[:-1], blocks, block_size)
    amax = grouped.abs().amax(-1)
    # floor(log2(amax)) exactly: frexp's exponent e has amax = m * 2^e with m in [0.5, 1)
    exponent = torch.frexp(amax).exponent.to(torch.int32) - 1 - _EMAX[dtype]
    exponent = torch.where(amax == 0, torch.full_like(exponent, -127), exponent).clamp(-127, 127)
    scale = torch.pow(2.0, exponent.double())
    y = _cast_float8((grouped.double() / scale.unsqueeze(-1)).float(), dtype)
    y = y.reshape(*input.shape[:-1], blocks * block_size)[..., :n].contiguous()
    codes = (exponent + 127).to(torch.uint8)
    codes = torch.nn.functional.pad(codes, (0, blocks % 2))
    return y, codes.reshape(*input.shape[:-1], -1, 2)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_dynamic_mx_quant(Tensor input, *, int axis=-1, str round_mode=\"rint\", int dst_type=296, "
            "int block_size=32, int? scale_alg=0, float dst_type_max=0.0, float max_low_bound=0.0) -> (Tensor, Tensor)")
_lib.impl("npu_dynamic_mx_quant", npu_dynamic_mx_quant, "CompositeImplicitAutograd")
