"""torch_npu's quantisation operators, each the aten composition of its documented integer math (so fake tensors and
torch.compile come from the aten ops; none of them has a backward in torch_npu: they are inference operators).

Shared conventions, where torch_npu's pages leave them open:

* ``round`` is round-half-to-even (``torch.round``, the ``rint`` mode Ascend's casts use), followed by saturation
  to the target type's range.
* int4 results (``dst_type=torch.quint4x2``) and int4 inputs (int32 tensors "each holding 8 int4 values") pack
  element ``8 i + j`` of the last dim into bits ``4 j .. 4 j + 3`` of int32 ``i`` (two's complement nibbles, the
  first element in the low nibble: the order of consecutive int4 values in little-endian memory).

Operators:

* ``npu_quantize(input, scales, zero_points, dtype, axis=1, div_mode=True)``: ``input / scales + zero_points``
  (``div_mode``) or ``input * scales + zero_points``, rounded and saturated to ``dtype`` (torch.qint8 -> int8,
  torch.quint8 -> uint8, torch.int32 -> int32; without ``div_mode`` torch.qint8 or torch.quint4x2 -> packed int32).
  ``scales``/``zero_points`` run along ``axis`` (1-D of that dim's size or 1) and broadcast over the other dims;
  without ``div_mode`` ``axis`` -2 is the second-to-last dim and any other value the last, and multi-dim scales
  (the input's rank, 1 off the axis) are accepted too.
* ``npu_anti_quant(x, scale, *, offset=None, dst_dtype=None, src_dtype=None)``: ``(x + offset) * scale`` in
  ``dst_dtype`` (default float16); an int32 ``x`` holds 8 int4 values each (its last dim is 1/8 of the result's).
* ``npu_dynamic_quant(x, *, smooth_scales=None, group_index=None, dst_type=None) -> (y, scale)``: per token (the
  last dim), ``scale = max|x * s| / DTYPE_MAX`` (127 for int8, 7 for int4), ``y = round(x * s / scale)``; ``s``
  is ``smooth_scales`` (1) or, with ``group_index`` (cumulative row ends), row ``r``'s group's row of it.
* ``npu_dynamic_quant_asymmetric(...) -> (y, scale, offset)``: ``scale = (max - min) / (DST_MAX - DST_MIN)``,
  ``offset = DST_MAX - max / scale``, ``y = round(x / scale + offset)`` (int8: [-128, 127], int4: [-8, 7]).
  A constant row (scale 0) quantises to 0 with scale 0 in both dynamic operators, rather than dividing by 0.
* ``npu_quant_matmul(x1, x2, scale, *, offset, pertoken_scale, bias, output_dtype)``: the exact integer product
  ``x1 @ x2`` (int8, or packed int4 in int32 along the last dims), an int32 ``bias`` added to it, then
  ``* scale`` (per column) ``* pertoken_scale`` (per row), a floating ``bias`` added after the scaling, ``offset``
  added for an int8 output, cast to ``output_dtype`` (None: int8, rounded and saturated; float16 / bfloat16).
* ``npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset, ..., bias, antiquant_group_size)``:
  ``x @ ((weight + antiquant_offset) * antiquant_scale) + bias`` in x's dtype; the scale/offset are per tensor
  ((1,) / (1, 1)), per channel ((N,) / (1, N)) or per group of ``antiquant_group_size`` rows of K
  ((ceil(K / g), N)); an int32 weight is (K, N / 8) packed int4.

Refused with a ValueError naming the argument: int64 scales (the bit layout ``npu_trans_quant_param`` writes is
not documented, and that operator is absent), ``output_dtype=torch.int32`` of ``npu_quant_matmul`` (no formula is
documented for it), ``quant_scale``/``quant_offset`` of ``npu_weight_quant_batchmatmul`` (no formula either), and
the wheel's newer parameters away from their defaults: ``quant_mode`` other than "pertoken" and ``dst_type_max``
of the dynamic quantisers, ``x1_dtype``/``x2_dtype``/``pertoken_scale_dtype``/``scale_dtype``/``group_sizes``/
``y_scale`` of ``npu_quant_matmul`` and ``weight_dtype`` of ``npu_weight_quant_batchmatmul``.
"""
from __future__ import annotations

import torch

_INT_RANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int32: (-2 ** 31, 2 ** 31 - 1)}
_INT4 = (-8, 7)


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _saturate(y, lo, hi):
    """Round half to even, then clamp to [lo, hi] (in float64 so the int32 range is exact)."""
    return torch.round(y.double()).clamp(lo, hi)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Integer values in [-8, 7] with a last dim divisible by 8 -> int32 holding 8 of them each (low nibble first)."""
    nib = (q.to(torch.int64) & 0xF).reshape(*q.shape[:-1], q.shape[-1] // 8, 8)
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int64)
    word = (nib << shifts).sum(-1)
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def unpack_int4(w: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4`: int32 (..., n) -> int64 (..., 8 n) in [-8, 7]."""
    word = w.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 4, device=w.device, dtype=torch.int64)
    nib = (word.unsqueeze(-1) >> shifts) & 0xF
    nib = torch.where(nib >= 8, nib - 16, nib)
    return nib.reshape(*w.shape[:-1], w.shape[-1] * 8)


def _along(op, name, t, x, axis):
    """``t`` (1-D of x.shape[axis] or 1 entries, or x's rank with 1 off ``axis``) shaped to broadcast against x."""
    if t.dim() == 1:
        if t.shape[0] not in (1, x.shape[axis]):
            _fail(op, f"{name} must have 1 or {x.shape[axis]} entries (dim {axis} of input), got {t.shape[0]}")
        shape = [1] * x.dim()
        shape[axis] = t.shape[0]
        return t.reshape(shape)
    if t.dim() == x.dim() and all(s == 1 for d, s in enumerate(t.shape) if d != axis % x.dim()) \
            and t.shape[axis] in (1, x.shape[axis]):
        return t
    _fail(op, f"{name} of shape {tuple(t.shape)} does not run along dim {axis} of input {tuple(x.shape)}")


def npu_quantize(self, scales, zero_points, dtype, axis=1, div_mode=True):
    op, input = "npu_quantize", self
    if div_mode:
        targets = {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.int32: torch.int32}
        if dtype not in targets:
            _fail(op, f"dtype must be torch.qint8, torch.quint8 or torch.int32 with div_mode=True, got {dtype}")
        if not -input.dim() <= axis < input.dim():
            _fail(op, f"axis {axis} is out of range for a {input.dim()}-D input")
    else:
        if dtype not in (torch.qint8, torch.quint4x2):
            _fail(op, f"dtype must be torch.qint8 or torch.quint4x2 with div_mode=False, got {dtype}")
        if axis < -2 or axis >= input.dim():
            _fail(op, f"axis must be in [-2, {input.dim()}) with div_mode=False, got {axis}")
        axis = -2 if axis == -2 else -1
        if dtype == torch.quint4x2 and input.shape[-1] % 8:
            _fail(op, f"the last dim ({input.shape[-1]}) must be divisible by 8 for torch.quint4x2")
    x = input.double()
    s = _along(op, "scales", scales, input, axis).double()
    y = x / s if div_mode else x * s
    if zero_points is not None:
        y = y + _along(op, "zero_points", zero_points, input, axis).double()
    if dtype == torch.quint4x2:
        return pack_int4(_saturate(y, *_INT4))
    out = torch.int8 if dtype == torch.qint8 else targets[dtype]
    return _saturate(y, *_INT_RANGE[out]).to(out)


def npu_anti_quant(x, scale, *, offset=None, dst_dtype=None, src_dtype=None):
    op = "npu_anti_quant"
    if x.dtype not in (torch.int8, torch.int32):
        _fail(op, f"x must be int8, or int32 holding 8 int4 values, got {x.dtype}")
    if src_dtype is not None and src_dtype != (torch.int8 if x.dtype == torch.int8 else torch.quint4x2):
        _fail(op, f"src_dtype {src_dtype} does not describe an {x.dtype} x (int8 or torch.quint4x2 in int32)")
    dst = torch.float16 if dst_dtype is None else dst_dtype
    if dst not in (torch.float16, torch.bfloat16, torch.float32):
        _fail(op, f"dst_dtype must be float16 or bfloat16, got {dst}")
    v = x.double() if x.dtype == torch.int8 else unpack_int4(x).double()
    if scale.dim() != 1 or scale.shape[0] not in (1, v.shape[-1]):
        _fail(op, f"scale must be (1,) or ({v.shape[-1]},), got {tuple(scale.shape)}")
    if offset is not None:
        if tuple(offset.shape) != tuple(scale.shape):
            _fail(op, f"offset must have scale's shape {tuple(scale.shape)}, got {tuple(offset.shape)}")
        v = v + offset.double()
    return (v * scale.double()).to(dst)


def _smooth(op, x, smooth_scales, group_index):
    """x * smooth_scales, the row of smooth_scales chosen per token by group_index (cumulative row ends)."""
    if smooth_scales is None:
        if group_index is not None:
            _fail(op, "group_index needs smooth_scales")
        return x
    h = x.shape[-1]
    if group_index is None:
        if tuple(smooth_scales.shape) != (h,):
            _fail(op, f"smooth_scales must be ({h},) without group_index, got {tuple(smooth_scales.shape)}")
        return x * smooth_scales.double()
    if smooth_scales.dim() != 2 or smooth_scales.shape[1] != h or group_index.dim() != 1 \
            or group_index.shape[0] != smooth_scales.shape[0]:
        _fail(op, f"with group_index ({tuple(group_index.shape)}), smooth_scales must be (groups, {h}), got "
                  f"{tuple(smooth_scales.shape)}")
    rows = x.reshape(-1, h)
    row_id = torch.arange(rows.shape[0], device=x.device, dtype=torch.int64)
    group = torch.searchsorted(group_index.to(torch.int64).contiguous(), row_id, right=True)
    group = group.clamp(max=smooth_scales.shape[0] - 1)
    return (rows * smooth_scales.double()[group]).reshape(x.shape)


def _dst(op, dst_type):
    if dst_type is None or dst_type == torch.int8:
        return torch.int8, (-128, 127)
    if dst_type == torch.quint4x2:
        return torch.quint4x2, _INT4
    _fail(op, f"dst_type must be torch.int8 or torch.quint4x2, got {dst_type}")


def _finish(q, dst):
    return pack_int4(q) if dst == torch.quint4x2 else q.to(torch.int8)


def _check_x(op, x, dst):
    if x.dim() < 2:
        _fail(op, f"x must have more than 1 dim, got {x.dim()}")
    if dst == torch.quint4x2 and x.shape[-1] % 8:
        _fail(op, f"the last dim ({x.shape[-1]}) must be divisible by 8 for torch.quint4x2")


def _modes(op, quant_mode, dst_type_max):
    if quant_mode != "pertoken":
        _fail(op, f"quant_mode: only 'pertoken' (the documented per-token math) is supported, got {quant_mode!r}")
    if dst_type_max != 0.0:
        _fail(op, f"dst_type_max: only 0.0 (the type's own maximum) is supported, got {dst_type_max}")


def _prepared(op, x, smooth_scales, group_index, dst_type, quant_mode, dst_type_max):
    """The checks both dynamic quantisers share; returns the target, its range and the smoothed rows."""
    _modes(op, quant_mode, dst_type_max)
    dst, (lo, hi) = _dst(op, dst_type)
    _check_x(op, x, dst)
    return dst, lo, hi, _smooth(op, x.double(), smooth_scales, group_index)


def npu_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                      dst_type_max=0.0):
    dst, lo, hi, v = _prepared("npu_dynamic_quant", input, smooth_scales, group_index, dst_type, quant_mode,
                               dst_type_max)
    scale = v.abs().amax(-1) / hi
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = _saturate(v / safe.unsqueeze(-1), lo, hi)
    return _finish(q, dst), scale.float()


def npu_dynamic_quant_asymmetric(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                                 dst_type_max=0.0):
    dst, lo, hi, v = _prepared("npu_dynamic_quant_asymmetric", input, smooth_scales, group_index, dst_type,
                               quant_mode, dst_type_max)
    vmax, vmin = v.amax(-1), v.amin(-1)
    scale = (vmax - vmin) / (hi - lo)
    flat = scale == 0
    safe = torch.where(flat, torch.ones_like(scale), scale)
    offset = torch.where(flat, torch.zeros_like(scale), hi - vmax / safe)
    q = _saturate(v / safe.unsqueeze(-1) + offset.unsqueeze(-1), lo, hi)
    q = torch.where(flat.unsqueeze(-1), torch.zeros_like(q), q)
    return _finish(q, dst), scale.float(), offset.float()


def _per_column(op, name, t, n):
    if t.dim() not in (1, 2) or t.shape[-1] not in (1, n) or (t.dim() == 2 and t.shape[0] != 1):
        _fail(op, f"{name} must be (1,), ({n},) or (1, {n}), got {tuple(t.shape)}")
    return t.reshape(-1).double()


def dequant_product(op, x1, x2, scale, pertoken_scale, bias):
    """float64 ``(x1 @ x2 + int32 bias) * scale * pertoken_scale + float bias`` of int8 (or int32-packed int4)
    operands: the shared math of the quantised matmuls."""
    a = x1.double() if x1.dtype == torch.int8 else unpack_int4(x1).double()
    b = x2.double() if x2.dtype == torch.int8 else unpack_int4(x2).double()
    if a.shape[-1] != b.shape[-2]:
        _fail(op, f"the K dims differ: x1 {tuple(a.shape)} and x2 {tuple(b.shape)} (int4 unpacked)")
    n = b.shape[-1]
    # |int8 products| summed over K < 2^53 for every K the op accepts (<= 65535): exact in float64
    acc = torch.matmul(a, b)
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + bias.double()
    y = acc * _per_column(op, "scale", scale, n)
    if pertoken_scale is not None:
        if tuple(pertoken_scale.shape) != (a.shape[-2],):
            _fail(op, f"pertoken_scale must be ({a.shape[-2]},), got {tuple(pertoken_scale.shape)}")
        y = y * pertoken_scale.double().unsqueeze(-1)
    if bias is not None and bias.dtype != torch.int32:
        y = y + bias.double()
    return y


def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None, x1_dtype=None,
                     x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None, y_scale=None):
    op = "npu_quant_matmul"
    # these select the low-bit float (float8/float4) and per-group variants, whose math the page does not give
    for name, value in (("x1_dtype", x1_dtype), ("x2_dtype", x2_dtype), ("pertoken_scale_dtype", pertoken_scale_dtype),
                        ("scale_dtype", scale_dtype), ("group_sizes", group_sizes), ("y_scale", y_scale)):
        if value is not None:
            _fail(op, f"{name} is not supported (only its default None)")
    if x1.dtype != x2.dtype or x1.dtype not in (torch.int8, torch.int32):
        _fail(op, f"x1 and x2 must both be int8, or both int32 holding int4, got {x1.dtype} and {x2.dtype}")
    if not 2 <= x1.dim() <= 6 or not 2 <= x2.dim() <= 6:
        _fail(op, f"x1 and x2 must have 2 to 6 dims, got {x1.dim()} and {x2.dim()}")
    if scale.dtype == torch.int64:
        _fail(op, "scale: int64 (npu_trans_quant_param's packed form) is not supported; pass the float32 scale")
    out_dtype = torch.int8 if output_dtype is None else output_dtype
    if out_dtype not in (torch.int8, torch.float16, torch.bfloat16):
        _fail(op, f"output_dtype must be None/torch.int8, torch.float16 or torch.bfloat16, got {out_dtype}")
    if offset is not None and (x1.dtype != torch.int8 or out_dtype != torch.int8):
        _fail(op, "offset is only supported for int8 inputs with an int8 output")
    y = dequant_product(op, x1, x2, scale, pertoken_scale, bias)
    n = y.shape[-1]
    if out_dtype != torch.int8:
        return y.to(out_dtype)
    if offset is not None:
        y = y + _per_column(op, "offset", offset, n)
    return _saturate(y, -128, 127).to(torch.int8)


def npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                 quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0,
                                 weight_dtype=None):
    op = "npu_weight_quant_batchmatmul"
    if weight_dtype is not None:
        _fail(op, "weight_dtype (reinterpreting the weight as another low-bit type) is not supported")
    if quant_scale is not None or quant_offset is not None:
        _fail(op, "quant_scale/quant_offset (the int8 output quantisation) are not supported")
    if antiquant_scale.dtype == torch.int64:
        _fail(op, "antiquant_scale: int64 (npu_trans_quant_param's packed form) is not supported")
    if x.dim() != 2 or weight.dim() != 2:
        _fail(op, f"x and weight must be (M, K) and (K, N), got {tuple(x.shape)} and {tuple(weight.shape)}")
    if weight.dtype not in (torch.int8, torch.int32):
        _fail(op, f"weight must be int8, or int32 holding int4, got {weight.dtype}")
    w = weight.double() if weight.dtype == torch.int8 else unpack_int4(weight).double()
    k, n = w.shape
    if x.shape[1] != k:
        _fail(op, f"the K dims differ: x {tuple(x.shape)} and weight {(k, n)} (int4 unpacked)")

    def expand(name, t):
        if antiquant_group_size:
            groups = -(-k // antiquant_group_size)
            if tuple(t.shape) != (groups, n):
                _fail(op, f"{name} must be ({groups}, {n}) for antiquant_group_size {antiquant_group_size}, "
                          f"got {tuple(t.shape)}")
            return t.double().repeat_interleave(antiquant_group_size, 0)[:k]
        if t.numel() == 1:
            return t.double().reshape(1, 1)
        return _per_column(op, name, t, n).reshape(1, n)

    if antiquant_group_size < 0:
        _fail(op, f"antiquant_group_size must be >= 0, got {antiquant_group_size}")
    if antiquant_offset is not None:
        w = w + expand("antiquant_offset", antiquant_offset)
    w = w * expand("antiquant_scale", antiquant_scale)
    y = torch.matmul(x.double(), w)
    if bias is not None:
        y = y + bias.double().reshape(-1)
    return y.to(x.dtype)


# each operator's schema after its name (the names are the functions')
_SCHEMAS = {
    npu_quantize: "(Tensor self, Tensor scales, Tensor? zero_points, ScalarType dtype, int axis=1, bool div_mode=True)"
                  " -> Tensor",
    npu_anti_quant: "(Tensor x, Tensor scale, *, Tensor? offset=None, ScalarType? dst_dtype=None, "
                    "ScalarType? src_dtype=None) -> Tensor",
    npu_dynamic_quant: "(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
                       "ScalarType? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) "
                       "-> (Tensor, Tensor)",
    npu_dynamic_quant_asymmetric: "(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
                                  "ScalarType? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) "
                                  "-> (Tensor, Tensor, Tensor)",
    npu_quant_matmul: "(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, Tensor? pertoken_scale=None, "
                      "Tensor? bias=None, ScalarType? output_dtype=None, ScalarType? x1_dtype=None, "
                      "ScalarType? x2_dtype=None, ScalarType? pertoken_scale_dtype=None, ScalarType? scale_dtype=None, "
                      "int[]? group_sizes=None, Tensor? y_scale=None) -> Tensor",
    npu_weight_quant_batchmatmul: "(Tensor x, Tensor weight, Tensor antiquant_scale, Tensor? antiquant_offset=None, "
                                  "Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? bias=None, "
                                  "int antiquant_group_size=0, int inner_precise=0, ScalarType? weight_dtype=None) "
                                  "-> Tensor",
}
_lib = torch.library.Library("npu", "FRAGMENT")
for _fn, _schema in _SCHEMAS.items():
    _lib.define(_fn.__name__ + _schema)
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
