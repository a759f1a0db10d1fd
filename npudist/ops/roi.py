"""torch_npu's region-of-interest pooling operators, each an aten composition (gathers and arithmetic), so the
features' gradient (Ascend's backward operators) comes from autograd, and fake tensors and compile from the aten ops.

* ``npu_roi_align(features (N, C, H, W), rois (K, 5), spatial_scale, pooled_height, pooled_width, sample_num,
  roi_end_mode)`` -> (K, C, pooled_height, pooled_width): rois ``[batch_index, x0, y0, x1, y1]`` scaled by
  ``spatial_scale`` (``roi_end_mode`` 1 moves the end by ``+1 * spatial_scale``, 0 does not); the RoI (at least
  1 x 1) is cut into bins, each the mean of ``sample_num`` x ``sample_num`` bilinear samples at the sub-bin centres
  (``sample_num`` 0: ``ceil(bin size)`` samples per side, per RoI); samples beyond one pixel outside the map are 0,
  others clamp to the border (Mask R-CNN's RoIAlign without the half-pixel shift, as the documented example).
* ``npu_ps_roi_pooling(x (N, C, H, W), rois (B, 5, R), spatial_scale, group_size, output_dim)`` ->
  (B * R, output_dim, group_size, group_size): R-FCN's position-sensitive average pooling. Each RoI
  ``[batch_id, x1, y1, x2, y2]`` (rounded, end + 1, times ``spatial_scale``; at least 0.1 wide) is cut into
  ``group_size`` x ``group_size`` bins; bin (i, j) of output channel ``c`` averages channel
  ``(c * group_size + i) * group_size + j`` over the pixels the bin covers (floor / ceil of its bounds, clipped to
  the map); an empty bin, or a batch id outside the input, gives 0. ``C`` must be
  ``output_dim * group_size ** 2`` (Ascend's NC1HWC0 storage of it is a format tag here).
"""
from __future__ import annotations

import torch


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _up(x):
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _axis_samples(start, size, pooled, samples, per_roi):
    """Sample coordinates (K, pooled * S) along one axis and their validity (sample_num 0: per-RoI counts)."""
    bin_size = size / pooled                                           # (K,)
    s = torch.arange(samples, device=start.device, dtype=start.dtype)
    p = torch.arange(pooled, device=start.device, dtype=start.dtype)
    count = per_roi.to(start.dtype) if per_roi is not None else torch.full_like(start, samples)
    pos = start[:, None, None] + bin_size[:, None, None] * (p[None, :, None] + (s[None, None, :] + 0.5)
                                                            / count[:, None, None])
    valid = s[None, None, :] < count[:, None, None]
    return pos.reshape(start.shape[0], -1), valid.expand(-1, pooled, -1).reshape(start.shape[0], -1)


def _corners(pos, extent):
    """torchvision's bilinear corner indices and weights along one axis (outside: weight 0)."""
    outside = (pos < -1.0) | (pos > extent)
    pos = pos.clamp(min=0.0)
    low = pos.floor().clamp(max=extent - 1)
    at_end = low >= extent - 1
    high = torch.where(at_end, low, low + 1)
    pos = torch.where(at_end, low, pos)
    frac = pos - low
    keep = (~outside).to(pos.dtype)
    return low.long(), high.long(), (1 - frac) * keep, frac * keep


def npu_roi_align(self, rois, spatial_scale, pooled_height, pooled_width, sample_num, roi_end_mode):
    op = "npu_roi_align"
    if self.dim() != 4 or rois.dim() != 2 or rois.shape[1] != 5:
        _fail(op, f"features must be (N, C, H, W) and rois (K, 5), got {tuple(self.shape)} and {tuple(rois.shape)}")
    if roi_end_mode not in (0, 1) or sample_num < 0 or pooled_height <= 0 or pooled_width <= 0:
        _fail(op, f"need roi_end_mode 0 or 1, sample_num >= 0 and positive pooled sizes, got {roi_end_mode}, "
                  f"{sample_num}, {pooled_height}x{pooled_width}")
    return roi_align(self, rois, spatial_scale, pooled_height, pooled_width, sample_num,
                     end=1.0 if roi_end_mode == 1 else 0.0, aligned=False)


def roi_align(self, rois, spatial_scale, pooled_height, pooled_width, sample_num, end=0.0, aligned=False):
    """RoIAlign of (N, C, H, W) features: ``aligned`` False is npu_roi_align's (RoIs at least 1 x 1, ``end`` added
    to the RoI's far corner before scaling); True is Detectron2's aligned RoIAlign (torch_npu.contrib's ROIAlign
    default): the scaled RoI shifted by -0.5 pixel, no minimum size, an empty RoI pooling to 0."""
    _, c, h, w = self.shape
    r = _up(rois)
    shift = 0.5 if aligned else 0.0
    x0, y0 = r[:, 1] * spatial_scale - shift, r[:, 2] * spatial_scale - shift
    rw = (r[:, 3] + end) * spatial_scale - shift - x0
    rh = (r[:, 4] + end) * spatial_scale - shift - y0
    if not aligned:
        rw, rh = rw.clamp(min=1.0), rh.clamp(min=1.0)
    if sample_num > 0:
        sy = sx = sample_num
        per_y = per_x = None
    else:  # adaptive: ceil(bin size) samples per side, a count per RoI
        per_y, per_x = torch.ceil(rh / pooled_height), torch.ceil(rw / pooled_width)
        sy = max(int(per_y.max()), 1) if rois.shape[0] else 1   # aligned RoIs may be empty: no samples
        sx = max(int(per_x.max()), 1) if rois.shape[0] else 1
    ys, vy = _axis_samples(y0, rh, pooled_height, sy, per_y)          # (K, PH*SY)
    xs, vx = _axis_samples(x0, rw, pooled_width, sx, per_x)           # (K, PW*SX)
    yl, yh, wyl, wyh = _corners(ys, h)
    xl, xh, wxl, wxh = _corners(xs, w)
    feat = _up(self)
    b = r[:, 0].long()[:, None, None]

    def tap(yi, xi):  # (K, Y, X, C)
        return feat[b, :, yi[:, :, None], xi[:, None, :]]

    val = (tap(yl, xl) * (wyl[:, :, None] * wxl[:, None, :])[..., None]
           + tap(yl, xh) * (wyl[:, :, None] * wxh[:, None, :])[..., None]
           + tap(yh, xl) * (wyh[:, :, None] * wxl[:, None, :])[..., None]
           + tap(yh, xh) * (wyh[:, :, None] * wxh[:, None, :])[..., None])
    mask = (vy[:, :, None] & vx[:, None, :]).to(val.dtype)[..., None]
    k = rois.shape[0]
    val = (val * mask).reshape(k, pooled_height, sy, pooled_width, sx, c).sum((2, 4))
    count = mask.reshape(k, pooled_height, sy, pooled_width, sx, 1).sum((2, 4)).clamp(min=1.0)   # empty: 0
    return (val / count).permute(0, 3, 1, 2).to(self.dtype)


def npu_ps_roi_pooling(self, rois, spatial_scale, group_size, output_dim):
    op = "npu_ps_roi_pooling"
    if not 0 < group_size < 128 or output_dim <= 0:
        _fail(op, f"group_size must be in (0, 128) and output_dim > 0, got {group_size}, {output_dim}")
    if self.dim() != 4 or self.shape[1] != output_dim * group_size ** 2:
        _fail(op, f"x must be (N, output_dim * group_size^2 = {output_dim * group_size ** 2}, H, W), got "
                  f"{tuple(self.shape)}")
    if rois.dim() != 3 or rois.shape[1] != 5:
        _fail(op, f"rois must be (batch, 5, rois_num), got {tuple(rois.shape)}")
    n, _, h, w = self.shape
    g = group_size
    r = _up(rois).permute(0, 2, 1).reshape(-1, 5)                      # (K, 5)
    x1, y1 = torch.round(r[:, 1]) * spatial_scale, torch.round(r[:, 2]) * spatial_scale
    x2, y2 = (torch.round(r[:, 3]) + 1) * spatial_scale, (torch.round(r[:, 4]) + 1) * spatial_scale
    bw, bh = (x2 - x1).clamp(min=0.1) / g, (y2 - y1).clamp(min=0.1) / g
    p = torch.arange(g, device=self.device, dtype=r.dtype)
    hs = torch.floor(p * bh[:, None] + y1[:, None]).clamp(0, h).long()  # (K, g)
    he = torch.ceil((p + 1) * bh[:, None] + y1[:, None]).clamp(0, h).long()
    ws = torch.floor(p * bw[:, None] + x1[:, None]).clamp(0, w).long()
    we = torch.ceil((p + 1) * bw[:, None] + x1[:, None]).clamp(0, w).long()
    # box sums from the integral image: S[y, x] = sum of x[:y, :x]
    integral = torch.nn.functional.pad(_up(self).cumsum(2).cumsum(3), (1, 0, 1, 0))  # (N, C, H+1, W+1)
    b = r[:, 0].long()
    in_batch = (b >= 0) & (b < n)
    b = b.clamp(0, n - 1)
    # channel of (output channel c, bin i, j): (c * g + i) * g + j
    ch = ((torch.arange(output_dim, device=self.device)[:, None, None] * g + torch.arange(g, device=self.device)
           [None, :, None]) * g + torch.arange(g, device=self.device)[None, None, :])  # (D, g, g)
    bb = b[:, None, None, None]

    def at(yy, xx):  # (K, D, g, g): integral at row yy[k, i], column xx[k, j]
        return integral[bb, ch[None], yy[:, None, :, None], xx[:, None, None, :]]

    total = at(he, we) - at(hs, we) - at(he, ws) + at(hs, ws)
    area = ((he - hs)[:, :, None] * (we - ws)[:, None, :]).to(total.dtype)[:, None]
    empty = (area <= 0) | ~in_batch[:, None, None, None]
    out = torch.where(empty, 0.0, total / torch.where(empty, 1.0, area))
    return out.to(self.dtype)


_lib = torch.library.Library("npu", "FRAGMENT")
for _schema, _fn in (
        ("npu_roi_align(Tensor self, Tensor rois, float spatial_scale, int pooled_height, int pooled_width, "
         "int sample_num, int roi_end_mode) -> Tensor", npu_roi_align),
        ("npu_ps_roi_pooling(Tensor self, Tensor rois, float spatial_scale, int group_size, int output_dim) -> Tensor",
         npu_ps_roi_pooling)):
    _lib.define(_schema)
    _lib.impl(_schema.split("(", 1)[0], _fn, "CompositeImplicitAutograd")
