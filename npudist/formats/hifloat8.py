"""HiFloat8 (HiF8) <-> float, as tensor ops on any device (torch_npu's ``HiFloat8Tensor`` stores these codes).

HiF8 is the 8-bit format of "Ascend HiFloat8 Format for Deep Learning" (Luo et al., arXiv 2409.16626). A code
is, from the top bit: the sign S, a prefix-coded dot field, the exponent E (sign-magnitude, D bits, the
magnitude's leading 1 implicit) and the mantissa M:

    dot   D  exponents        mantissa bits   value
    11    4  +-8 .. +-15      1               (-1)^S 2^E 1.M
    10    3  +-4 .. +-7       2
    01    2  +-2, +-3         3
    001   1  +-1              3
    0001  0  0                3
    0000  denormal            3 (as exponent)  (-1)^S 2^(M-23), M = 1..7

Special codes: 0x00 is the only zero, 0x80 the only NaN, 0x6F / 0xEF (the pattern that would be +-1.5 * 2^15)
are +-inf. Finite magnitudes run from 2^-22 (smallest denormal) over 2^-15 (smallest normal) to 2^15 = 32768.
Every one of the 256 codes encodes a distinct value, so decode then encode returns every code.

Float to HiF8 rounds to the nearest HiF8 value, ties away from zero (the paper's "TA" rounding; Ascend C's
CAST_ROUND for hifloat8). The inf pattern sits on the grid where 1.5 * 2^15 would, so a magnitude that rounds
to it, 1.25 * 2^15 = 40960 (the midpoint to 2^15) and above, becomes +-inf, or +-2^15 with ``saturate=True``;
+-inf stays +-inf and NaN becomes NaN. Below the smallest denormal, 2^-23 (the midpoint to zero) rounds away to
2^-22 and anything smaller becomes the one zero, whatever its sign.
"""
from __future__ import annotations

import functools

import torch

# (dot prefix, prefix bits, exponent bits D, mantissa bits) of the normal encodings, as the paper tabulates them.
_DOTS = ((0b11, 2, 4, 1), (0b10, 2, 3, 2), (0b01, 2, 2, 3), (0b001, 3, 1, 3), (0b0001, 4, 0, 3))
_DENORMAL_BIAS = 23   # denormal value 2^(M - 23)
MIN_EXPONENT = -22    # smallest denormal 2^-22
MAX_EXPONENT = 15     # largest finite 2^15
MAX = 2.0 ** MAX_EXPONENT
MIN_NORMAL = 2.0 ** -15
MIN_DENORMAL = 2.0 ** MIN_EXPONENT
ZERO_CODE = 0x00
NAN_CODE = 0x80
INF_CODE = 0x6F       # dot 11, exponent +15, mantissa 1: the value 1.5 * 2^15 stands for inf
MAX_CODE = 0x6E
# fp32 bit patterns the encoder compares against (magnitudes, sign cleared).
_OVERFLOW_BITS = 0x47400000   # 1.5 * 2^15: a rounded magnitude this large is the inf pattern or beyond
_FP32_MANTISSA = 23
_FP32_BIAS = 127


def _exponent_tables() -> tuple[list[int], list[int]]:
    """For every exponent -23..15: the code's bits other than the mantissa, and the mantissa width."""
    base, width = [], []
    for e in range(MIN_EXPONENT - 1, MAX_EXPONENT + 1):
        if e == MIN_EXPONENT - 1:
            base.append(ZERO_CODE)  # [2^-23, 2^-22) all rounds to 2^-22: the encoder sets it, not this entry
            width.append(0)
            continue
        if e < -15:             # denormal: dot 0000, the 3-bit field holds e + 23
            base.append(e + _DENORMAL_BIAS)
            width.append(0)
            continue
        mag = abs(e)
        d = mag.bit_length()    # exponent bits: 0 for E = 0, 1 for 1, 2 for 2..3, 3 for 4..7, 4 for 8..15
        prefix, prefix_bits, _, mbits = next(entry for entry in _DOTS if entry[2] == d)
        code = prefix << (7 - prefix_bits)
        if d:
            exp_field = ((1 if e < 0 else 0) << (d - 1)) | (mag - (1 << (d - 1)))  # sign, magnitude w/o its 1
            code |= exp_field << mbits
        base.append(code)
        width.append(mbits)
    return base, width


_BASE, _WIDTH = _exponent_tables()


@functools.lru_cache(maxsize=None)
def _decode_table_cpu() -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.int64)
    sign = codes >> 7
    mag = codes & 0x7F
    exponent = torch.zeros_like(codes)
    mantissa = torch.zeros(256, dtype=torch.float64)
    matched = torch.zeros(256, dtype=torch.bool)
    for prefix, prefix_bits, d, mbits in _DOTS:
        hit = (mag >> (7 - prefix_bits)) == prefix
        field = mag & ((1 << (7 - prefix_bits)) - 1)
        m = field & ((1 << mbits) - 1)
        if d:
            e_field = field >> mbits
            e_mag = (1 << (d - 1)) | (e_field & ((1 << (d - 1)) - 1))
            e = torch.where(((e_field >> (d - 1)) & 1).bool(), -e_mag, e_mag)
        else:
            e = torch.zeros_like(field)
        exponent = torch.where(hit, e, exponent)
        mantissa = torch.where(hit, 1.0 + m.double() / (1 << mbits), mantissa)
        matched |= hit
    # dot 0000: denormal 2^(M - 23); M = 0 is zero (S = 0) or NaN (S = 1)
    denormal_m = mag & 0x7
    exponent = torch.where(matched, exponent, denormal_m - _DENORMAL_BIAS)
    mantissa = torch.where(matched, mantissa, (denormal_m > 0).double())
    value = torch.ldexp(mantissa, exponent.double())
    value = torch.where(sign.bool(), -value, value)
    value[ZERO_CODE] = 0.0
    value[NAN_CODE] = float("nan")
    value[INF_CODE] = float("inf")
    value[INF_CODE | 0x80] = float("-inf")
    return value.float()


@functools.lru_cache(maxsize=None)
def _decode_table_on(device: str) -> torch.Tensor:
    return _decode_table_cpu().to(device)


def decode_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 256 HiF8 values as float32, indexed by code (every HiF8 value is exact in float32/16 and bfloat16)."""
    return _decode_table_cpu().to(device, copy=True)


def _check_codes(codes: torch.Tensor) -> None:
    if not isinstance(codes, torch.Tensor) or codes.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"HiFloat8 codes must be a uint8 (or int8) tensor, got "
                         f"{getattr(codes, 'dtype', type(codes).__name__)}; encode floats with to_hifloat8 first")


def from_hifloat8(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode HiF8 codes (uint8) to ``dtype`` (a floating dtype), on the codes' device, same shape."""
    _check_codes(codes)
    if not dtype.is_floating_point:
        raise ValueError(f"HiFloat8 decodes to a floating dtype (float32, float16, bfloat16, float64), not {dtype}")
    table = _decode_table_on(str(codes.device))
    index = codes.view(torch.uint8).to(torch.int32).reshape(-1)
    return torch.index_select(table, 0, index).view(codes.shape).to(dtype)


def _encode_float32(x: torch.Tensor, saturate: bool) -> torch.Tensor:
    """The rounding itself, on float32 ``x``: HiF8 codes as int32."""
    bits = x.contiguous().view(torch.int32)
    negative = bits < 0
    mag = bits & 0x7FFFFFFF
    is_nan = mag > 0x7F800000
    exp_in = (mag >> _FP32_MANTISSA) - _FP32_BIAS
    idx_in = exp_in.clamp(MIN_EXPONENT, MAX_EXPONENT) - (MIN_EXPONENT - 1)
    width = torch.tensor(_WIDTH, dtype=torch.int32, device=x.device)
    base = torch.tensor(_BASE, dtype=torch.int32, device=x.device)
    # Round the fp32 magnitude to the mantissa width of its own binade: adding half an ulp of the target grid
    # and clearing the dropped bits rounds ties away from zero; a carry moves into the next binade, whose grid
    # contains the result (a power of two), so one rounding suffices.
    drop = _FP32_MANTISSA - width[idx_in]
    rounded = (mag + (1 << (drop - 1))) & ~((1 << drop) - 1)
    exp_out = (rounded >> _FP32_MANTISSA) - _FP32_BIAS
    idx_out = exp_out.clamp(MIN_EXPONENT - 1, MAX_EXPONENT) - (MIN_EXPONENT - 1)
    fraction = rounded & ((1 << _FP32_MANTISSA) - 1)
    code = base[idx_out] | (fraction >> (_FP32_MANTISSA - width[idx_out]))
    # [2^-23, 2^-22): at or above the midpoint between 0 and the smallest denormal, so away to 2^-22.
    code = torch.where(exp_in == MIN_EXPONENT - 1, 0x01, code)
    code = torch.where(exp_in < MIN_EXPONENT - 1, ZERO_CODE, code)
    overflow = rounded >= _OVERFLOW_BITS
    code = torch.where(overflow, MAX_CODE if saturate else INF_CODE, code)
    code = torch.where(mag == 0x7F800000, INF_CODE, code)
    code = torch.where(negative & (code != ZERO_CODE), code | 0x80, code)
    return torch.where(is_nan, NAN_CODE, code)


@functools.lru_cache(maxsize=None)
def _encode_table(device: str, saturate: bool) -> torch.Tensor:
    """The code of every float32 by its top 16 bits (sign, exponent, 7 mantissa bits), as uint8.

    Rounding half away from zero needs only the first dropped bit (at or above the midpoint rounds away), and
    HiF8 keeps at most 3 mantissa bits, so the top 16 bits decide the code; only NaN, whose payload may sit in
    the low bits, needs the rest. One gather per element instead of the rounding's ~20 passes.
    """
    top = torch.arange(1 << 16, dtype=torch.int32) << 16
    return _encode_float32(top.view(torch.float32), saturate).to(torch.uint8).to(device)


def to_hifloat8(x: torch.Tensor, *, saturate: bool = False) -> torch.Tensor:
    """Encode ``x`` as HiF8 codes (uint8, same shape and device), rounding to nearest with ties away from zero.

    Float16 / bfloat16 inputs are exact in float32; other dtypes are converted to float32 first (as torch_npu's
    cast does). ``saturate=True`` clamps finite overflow to +-2^15 instead of +-inf.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"to_hifloat8 takes a tensor, got {type(x).__name__}; wrap it with torch.as_tensor")
    if x.is_complex():
        raise ValueError("HiFloat8 encodes real numbers; pass x.real / x.imag separately")
    x = x.detach()
    if x.dtype == torch.bfloat16:   # a bfloat16 is the top 16 bits of its float32
        top = x.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    else:
        top = (x.float().contiguous().view(torch.int32) >> 16) & 0xFFFF
    table = _encode_table(str(x.device), saturate)
    code = torch.index_select(table, 0, top.reshape(-1)).view(x.shape)
    return torch.where(torch.isnan(x), NAN_CODE, code).to(torch.uint8)
