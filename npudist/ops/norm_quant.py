"""torch_npu's residual-add + RMS norm + quantisation operators, composed of the documented pieces: the add,
``npu_rms_norm``'s math (``rstd = 1 / sqrt(mean(x^2) + epsilon)`` over gamma's trailing dims, ``x * rstd * gamma``)
plus ``beta``, then ``npu_quantize``'s static or ``npu_dynamic_quant``'s per-token quantisation (npudist.ops.quant:
rounding half to even, saturation, int4 packing).

* ``npu_add_rms_norm_quant(x1, x2, gamma, scales1, zero_points1, beta=None, scales2=None, zero_points2=None, *,
  axis=-1, epsilon=1e-6, div_mode=True, dst_type=None) -> (y1, y2, x_out)``: ``x_out = x1 + x2``,
  ``n = rms_norm(x_out) * gamma + beta``, ``y_k = round(n / scales_k + zero_points_k)`` (``div_mode``) or
  ``round(n * scales_k + zero_points_k)`` as int8, scales/zero points of gamma's shape; without ``scales2`` the
  second output is the int8 zero of shape (1,) (no second quantisation was asked for).
* ``npu_add_rms_norm_dynamic_quant(x1, x2, gamma, *, smooth_scale1, smooth_scale2, beta, epsilon, output_mask,
  y_dtype) -> (y1, y2, x_out, scale1, scale2)``: the same norm, then per-token dynamic quantisation of
  ``n * smooth_scale_k`` (``scale = max|.| / DTYPE_MAX``); path 1 runs unless ``output_mask[0]`` is False, path 2
  when ``smooth_scale2`` is given or ``output_mask[1]`` is True; a path not run gives y (1,) and scale (1,) zeros
  (the documented shape of an invalid output).
"""
from __future__ import annotations

import torch

from npudist.ops.quant import _INT_RANGE, _saturate, npu_dynamic_quant


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _add_norm(op, x1, x2, gamma, beta, epsilon):
    if x1.shape != x2.shape:
        _fail(op, f"x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must have one shape")
    k = gamma.dim()
    if k == 0 or k > x1.dim() or tuple(x1.shape[x1.dim() - k:]) != tuple(gamma.shape):
        _fail(op, f"gamma's shape {tuple(gamma.shape)} must equal the trailing dims of x1 {tuple(x1.shape)}")
    if beta is not None and tuple(beta.shape) != tuple(gamma.shape):
        _fail(op, f"beta must have gamma's shape {tuple(gamma.shape)}, got {tuple(beta.shape)}")
    x = x1 + x2
    xf = x.double()
    dims = tuple(range(x.dim() - k, x.dim()))
    n = xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + epsilon) * gamma.double()
    if beta is not None:
        n = n + beta.double()
    return x, n


def npu_add_rms_norm_quant(x1, x2, gamma, scales1, zero_points1, beta=None, scales2=None, zero_points2=None, *,
                           axis=-1, epsilon=1e-6, div_mode=True, dst_type=None):
    op = "npu_add_rms_norm_quant"
    if dst_type is not None and dst_type != torch.int8:
        _fail(op, f"dst_type: only int8 (the documented output) is supported, got {dst_type}")
    if axis != -1:
        _fail(op, f"axis: only -1 is supported (documented as the only value), got {axis}")
    x, n = _add_norm(op, x1, x2, gamma, beta, epsilon)

    def quantize(name, scales, zero_points):
        for label, t in ((name, scales), ("zero points of " + name, zero_points)):
            if t is not None and tuple(t.shape) != tuple(gamma.shape):
                _fail(op, f"{label} must have gamma's shape {tuple(gamma.shape)}, got {tuple(t.shape)}")
        y = n / scales.double() if div_mode else n * scales.double()
        if zero_points is not None:
            y = y + zero_points.double()
        return _saturate(y, *_INT_RANGE[torch.int8]).to(torch.int8)

    y1 = quantize("scales1", scales1, zero_points1)
    y2 = quantize("scales2", scales2, zero_points2) if scales2 is not None else x.new_zeros(1, dtype=torch.int8)
    return y1, y2, x


def npu_add_rms_norm_dynamic_quant(x1, x2, gamma, *, smooth_scale1=None, smooth_scale2=None, beta=None, epsilon=1e-6,
                                   output_mask=None, y_dtype=None):
    op = "npu_add_rms_norm_dynamic_quant"
    if gamma.dim() != 1:
        _fail(op, f"gamma must be 1-D (the last dim of x1), got {tuple(gamma.shape)}")
    mask = list(output_mask) if output_mask else None
    if mask is not None and (len(mask) != 2 or not any(mask)):
        _fail(op, f"output_mask must be two flags, not both False, got {mask}")
    run1 = mask[0] if mask else True
    run2 = mask[1] if mask else smooth_scale2 is not None
    if (smooth_scale1 is not None and not run1) or (smooth_scale2 is not None and not run2):
        _fail(op, "output_mask must be True for each path given a smooth scale")
    if mask is None and smooth_scale2 is not None and smooth_scale1 is None:
        _fail(op, "smooth_scale2 needs smooth_scale1")
    x, n = _add_norm(op, x1, x2, gamma, beta, epsilon)
    outs = []
    for run, smooth in ((run1, smooth_scale1), (run2, smooth_scale2)):
        if run:
            outs.append(npu_dynamic_quant(n, smooth_scales=smooth, dst_type=y_dtype))
        else:
            outs.append((x.new_zeros(1, dtype=torch.int8 if y_dtype in (None, torch.int8) else torch.int32),
                         x.new_zeros(1, dtype=torch.float32)))
    (y1, s1), (y2, s2) = outs
    return y1, y2, x, s1, s2


_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_add_rms_norm_quant(Tensor x1, Tensor x2, Tensor gamma, Tensor scales1, Tensor? zero_points1, "
            "Tensor? beta=None, Tensor? scales2=None, Tensor? zero_points2=None, *, int axis=-1, float epsilon=1e-06, "
            "bool div_mode=True, ScalarType? dst_type=None) -> (Tensor, Tensor, Tensor)")
_lib.define("npu_add_rms_norm_dynamic_quant(Tensor x1, Tensor x2, Tensor gamma, *, Tensor? smooth_scale1=None, "
            "Tensor? smooth_scale2=None, Tensor? beta=None, float epsilon=1e-6, bool[2]? output_mask=None, "
            "ScalarType? y_dtype=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
for _fn in (npu_add_rms_norm_quant, npu_add_rms_norm_dynamic_quant):
    _lib.impl(_fn.__name__, _fn, "CompositeImplicitAutograd")
