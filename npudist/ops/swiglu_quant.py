"""torch_npu's SwiGLU + per-token dynamic quantisation operators, composed of the documented pieces: the SwiGLU of
the last dim's halves, then ``npu_dynamic_quant``'s math (npudist.ops.quant: ``y = round(h * s / scale)`` with
``scale = max|h * s| / DTYPE_MAX`` per token, round half to even, saturation, int4 packed 8 per int32). Inference
operators: fake tensors and compile come from the aten ops.

The SwiGLU, as the pages define ``activate_left``: with ``a, b`` the first and second half of the last dim,
``swish(a) * b`` when ``activate_left`` is True, ``swish(b) * a`` when False (the default); ``swish(v) = v *
sigmoid(v)``. Groups: ``group_index`` assigns consecutive row ranges to groups, each with its own smoothing row;
rows past the groups' total take the last group's parameters (the pages leave those rows' values undefined).

* ``npu_swiglu_quant(x, *, smooth_scales=None, offsets=None, group_index=None, activate_left=False, quant_mode=0,
  group_list_type=0, dst_type=None) -> (y, scale)``: ``x`` (..., 2N) float; ``smooth_scales`` (G, N) per channel
  or (G,) per tensor (without ``group_index``: (N,), (1, N) or (1,)); ``group_index`` (G,) int cumulative row
  ends (``group_list_type`` 0) or counts (1); ``dst_type`` torch.int8 (None) or torch.quint4x2 (packed int32, N
  divisible by 8). ``scale`` has x's shape without the last dim.
* ``npu_dequant_swiglu_quant(x, *, weight_scale=None, activation_scale=None, bias=None, quant_scale=None,
  quant_offset=None, group_index=None, activate_left=False, quant_mode=0, swiglu_mode=0, ...) -> (y, scale)``:
  ``x`` (T, 2H); an int32 ``x`` (a matmul accumulator) is first dequantised, ``(x + bias) * weight_scale[g] *
  activation_scale[t]`` (int32 ``bias`` (2H,) on the integers, ``weight_scale`` (G, 2H), ``activation_scale``
  (T,)); a float16 / bfloat16 ``x`` is used as is. ``quant_scale`` (G, H) smooths per group; ``group_index``
  (G,) holds counts (the only documented mode). y is int8 (T, H), scale float32 (T,).

Refused with a ValueError naming the argument: ``quant_mode`` 0 (static quantisation: the pages do not say how
``smooth_scales``/``offsets`` or ``quant_scale``/``quant_offset`` apply -- divided or multiplied -- so pass
``quant_mode=1``), ``swiglu_mode`` 1 (the clamped variant: the page does not say whether it splits the halves
or interleaves them, the two layouts npu_clipped_swiglu offers); of the wheel's parameters missing from the page,
``dst_type`` other than int8, ``round_mode`` other than None and ``activate_dim`` other than the last dim.
"""
from __future__ import annotations

import torch

from npudist.ops.quant import npu_dynamic_quant


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _swiglu(op, x, activate_left):
    if x.shape[-1] % 2:
        _fail(op, f"x's last dim ({x.shape[-1]}) must be even (it is split in halves)")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    a, b = x.to(acc).chunk(2, -1)
    return torch.nn.functional.silu(a) * b if activate_left else torch.nn.functional.silu(b) * a


def _dynamic_only(op, quant_mode, names):
    if quant_mode == 0:
        _fail(op, f"quant_mode 0 (static) is not supported: the page does not say how {names} apply (divided or "
                  f"multiplied); use quant_mode=1 (dynamic)")
    if quant_mode != 1:
        _fail(op, f"quant_mode must be 0 (static) or 1 (dynamic), got {quant_mode}")


def _cumulative(op, group_index, group_list_type):
    if group_index.dim() != 1 or group_index.is_floating_point():
        _fail(op, f"group_index must be a 1-D integer tensor, got {group_index.dtype} {tuple(group_index.shape)}")
    if group_list_type == 0:
        return group_index
    if group_list_type == 1:
        return torch.cumsum(group_index.to(torch.int64), 0)
    _fail(op, f"group_list_type must be 0 (cumsum) or 1 (count), got {group_list_type}")


def npu_swiglu_quant(x, *, smooth_scales=None, offsets=None, group_index=None, activate_left=False, quant_mode=0,
                     group_list_type=0, dst_type=None):
    op = "npu_swiglu_quant"
    _dynamic_only(op, quant_mode, "smooth_scales / offsets")
    if x.dim() < 2:
        _fail(op, f"x must have more than 1 dim, got {x.dim()}")
    h = _swiglu(op, x, activate_left)
    n = h.shape[-1]
    smooth, ends = smooth_scales, None
    if group_index is not None:
        ends = _cumulative(op, group_index, group_list_type)
        if smooth_scales is None:
            _fail(op, "group_index needs smooth_scales (one row per group)")
        if smooth_scales.dim() == 1 and smooth_scales.shape[0] == group_index.shape[0]:
            smooth = smooth_scales.unsqueeze(-1).expand(-1, n)  # per tensor: one scale per group
        elif tuple(smooth_scales.shape) != (group_index.shape[0], n):
            _fail(op, f"smooth_scales must be (G, N) = ({group_index.shape[0]}, {n}) or (G,), got "
                      f"{tuple(smooth_scales.shape)}")
    elif smooth_scales is not None:
        if tuple(smooth_scales.shape) in ((1, n), (n,)):
            smooth = smooth_scales.reshape(n)
        elif smooth_scales.numel() == 1:
            smooth = smooth_scales.reshape(1).expand(n)
        else:
            _fail(op, f"without group_index smooth_scales must be (N,), (1, N) or (1,) with N = {n}, got "
                      f"{tuple(smooth_scales.shape)}")
    return npu_dynamic_quant(h, smooth_scales=smooth, group_index=ends, dst_type=dst_type)


def npu_dequant_swiglu_quant(x, *, weight_scale=None, activation_scale=None, bias=None, quant_scale=None,
                             quant_offset=None, group_index=None, activate_left=False, quant_mode=0, dst_type=None,
                             round_mode=None, activate_dim=None, swiglu_mode=0, clamp_limit=7.0, glu_alpha=1.702,
                             glu_bias=1.0):
    op = "npu_dequant_swiglu_quant"
    _dynamic_only(op, quant_mode, "quant_scale / quant_offset")
    # the wheel's newer parameters, not on the page: only the values meaning the documented behaviour
    if dst_type not in (None, 1):  # 1: torch.int8's ScalarType number, the documented output
        _fail(op, f"dst_type must be None or torch.int8 (the documented int8 output), got {dst_type}")
    if round_mode is not None:
        _fail(op, f"round_mode must be None (round half to even, the documented cast), got {round_mode}")
    if activate_dim not in (None, -1, 1):
        _fail(op, f"activate_dim must be None or the last dim (-1 / 1), got {activate_dim}")
    if swiglu_mode == 1:
        _fail(op, "swiglu_mode 1 (the clamped variant) is not supported: the page does not say whether it splits "
                  "the halves or interleaves them; use swiglu_mode=0")
    if swiglu_mode != 0:
        _fail(op, f"swiglu_mode must be 0 or 1, got {swiglu_mode}")
    if quant_offset is not None:
        _fail(op, "quant_offset applies to static quantisation only, which is not supported")
    if x.dim() != 2:
        _fail(op, f"x must be 2-D (TokensNum, 2H), got {tuple(x.shape)}")
    tokens, width = x.shape
    ends = None
    if group_index is not None:
        if bias is not None:
            _fail(op, "bias must be None with group_index (documented)")
        ends = _cumulative(op, group_index, 1)
    groups = 1 if group_index is None else group_index.shape[0]
    if ends is not None:
        row_group = torch.searchsorted(ends.to(torch.int64).contiguous(),
                                       torch.arange(tokens, device=x.device), right=True).clamp(max=groups - 1)
    else:
        row_group = torch.zeros(tokens, dtype=torch.int64, device=x.device)
    if x.dtype == torch.int32:
        if weight_scale is None or activation_scale is None:
            _fail(op, "an int32 x needs weight_scale and activation_scale to be dequantised")
        if tuple(weight_scale.shape) != (groups, width) or tuple(activation_scale.shape) != (tokens,):
            _fail(op, f"weight_scale must be (groupNum, 2H) = ({groups}, {width}) and activation_scale (TokensNum,) "
                      f"= ({tokens},), got {tuple(weight_scale.shape)} and {tuple(activation_scale.shape)}")
        xs = x.double()
        if bias is not None:
            if bias.dtype != torch.int32 or tuple(bias.shape) != (width,):
                _fail(op, f"bias must be int32 ({width},), got {bias.dtype} {tuple(bias.shape)}")
            xs = xs + bias.double()
        xs = xs * weight_scale.double()[row_group] * activation_scale.double().unsqueeze(-1)
    elif x.dtype in (torch.float16, torch.bfloat16, torch.float32):
        if weight_scale is not None or activation_scale is not None or bias is not None:
            _fail(op, "weight_scale, activation_scale and bias must be None for a floating x (no dequantisation)")
        xs = x
    else:
        _fail(op, f"x must be int32 (dequantised first), float16 or bfloat16, got {x.dtype}")
    h = _swiglu(op, xs, activate_left)
    if quant_scale is not None and tuple(quant_scale.shape) != (groups, width // 2):
        _fail(op, f"quant_scale must be (groupNum, H) = ({groups}, {width // 2}), got {tuple(quant_scale.shape)}")
    smooth = None if quant_scale is None else quant_scale.double()[row_group]
    if smooth is not None:
        h = h.double() * smooth
    return npu_dynamic_quant(h, dst_type=torch.int8)


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_swiglu_quant(Tensor x, *, Tensor? smooth_scales=None, Tensor? offsets=None, "
            "Tensor? group_index=None, bool activate_left=False, int quant_mode=0, int group_list_type=0, "
            "ScalarType? dst_type=None) -> (Tensor, Tensor)")
_lib.define("npu_dequant_swiglu_quant(Tensor x, *, Tensor? weight_scale=None, Tensor? activation_scale=None, "
            "Tensor? bias=None, Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? group_index=None, "
            "bool activate_left=False, int quant_mode=0, int? dst_type=None, int? round_mode=None, "
            "int? activate_dim=None, int swiglu_mode=0, float clamp_limit=7.0, "
            "float glu_alpha=1.702, float glu_bias=1.0) -> (Tensor, Tensor)")
for _fn in (npu_swiglu_quant, npu_dequant_swiglu_quant):
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
