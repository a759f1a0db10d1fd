"""torch_npu's box-overlap, box-coding and anchor-assignment operators (mmdetection's Ascend paths), each the
aten composition of its documented math, so autograd (the GIoU/DIoU/CIoU losses), fake tensors and compile
come from the aten ops. Boxes are ``[x1, y1, x2, y2]`` unless ``trans`` says ``[x_center, y_center, w, h]``.

* ``npu_iou`` / ``npu_ptiou(bboxes (N, 4), gtboxes (M, 4), mode=0)`` -> (M, N): ``out[m, n]`` compares
  ``gtboxes[m]`` with ``bboxes[n]``; iou = ``(overlap + 0.001) / (union + 0.001)``, ptiou =
  ``overlap / (union + 0.001)`` (torch_npu.contrib's formulas); mode 1 (IoF) divides by the ground-truth box's
  area instead of the union.
* ``npu_giou`` / ``npu_diou`` / ``npu_ciou(self (4, N), gtboxes (4, M), trans, is_cross, mode)``: GIoU =
  ``iou - (enclose - union) / enclose``; DIoU = ``iou - rho^2 / c^2`` (centre distance over the enclosing
  box's diagonal); CIoU = ``DIoU - alpha v``, ``v = 4 / pi^2 (atan(w_gt / h_gt) - atan(w / h))^2``,
  ``alpha = v / (1 - iou + v)`` held constant in the gradient (as the CIoU paper and YOLOv5). One-to-one
  (``is_cross=False``, N == M): GIoU is (N, 1), DIoU/CIoU (1, N) (torch_npu.contrib's shapes); cross: (M, N).
* ``npu_bounding_box_encode`` / ``_decode``: Faster R-CNN's deltas with the legacy ``+1`` box extent:
  ``dx = (gx - px) / pw``, ``dw = log(gw / pw)`` (of the absolute ratio, as the documented example's inverted box
  shows), normalised ``(d - means) / stds``; decoding denormalises, clamps ``dw, dh`` to
  ``|log(wh_ratio_clip)|``, and clamps x to ``[0, max_shape[1] - 1]``, y to ``[0, max_shape[0] - 1]``.
* ``npu_anchor_response_flags(self, featmap_size, stride, num_base_anchors)``: uint8 flags of the grid cells
  (``featmap_size`` = (h, w), ``stride`` = (x, y)) holding a ground-truth box centre, repeated per base anchor
  (mmdetection's YOLO ``responsible_flags``); centres outside the grid flag nothing.
* ``npu_grid_assign_positive``: mmdetection's ``GridAssigner`` positive steps on ``assigned_gt_inds``.
* ``npu_yolo_boxes_encode(self, gt_bboxes, stride, performance_mode=False)``: mmdetection's ``YOLOBBoxCoder.encode``
  (torch_npu's page for it carries another operator's text).
"""
from __future__ import annotations

import math

import torch

_IOU_EPS = 0.001
_YOLO_EPS = 1e-6


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _up(x):
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _rows4(op, name, t):
    if t.dim() != 2 or t.shape[1] != 4:
        _fail(op, f"{name} must be (n, 4), got {tuple(t.shape)}")


def _overlap(b, g):
    """Intersection and both areas of xyxy boxes ``b`` and ``g`` (broadcast)."""
    w = (torch.minimum(b[..., 2], g[..., 2]) - torch.maximum(b[..., 0], g[..., 0])).clamp(min=0)
    h = (torch.minimum(b[..., 3], g[..., 3]) - torch.maximum(b[..., 1], g[..., 1])).clamp(min=0)
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    area_g = (g[..., 2] - g[..., 0]) * (g[..., 3] - g[..., 1])
    return w * h, area_b, area_g


def _iou_matrix(op, bboxes, gtboxes, mode, numerator_eps):
    _rows4(op, "bboxes", bboxes)
    _rows4(op, "gtboxes", gtboxes)
    if mode not in (0, 1):
        _fail(op, f"mode must be 0 (IoU) or 1 (IoF), got {mode}")
    inter, area_b, area_g = _overlap(_up(bboxes)[None, :, :], _up(gtboxes)[:, None, :])
    denom = area_b + area_g - inter if mode == 0 else area_g
    return ((inter + numerator_eps) / (denom + _IOU_EPS)).to(bboxes.dtype)


def npu_iou(bboxes, gtboxes, mode=0):
    return _iou_matrix("npu_iou", bboxes, gtboxes, mode, _IOU_EPS)


def npu_ptiou(bboxes, gtboxes, mode=0):
    return _iou_matrix("npu_ptiou", bboxes, gtboxes, mode, 0.0)


# ---- GIoU / DIoU / CIoU on (4, n) boxes ----------------------------------------------------------------------
def _xyxy(cols, trans):
    """(4, n) columns -> (n, 4) xyxy rows."""
    b = _up(cols).t()
    if not trans:
        return b
    cx, cy, w, h = b.unbind(-1)
    return torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), -1)


def _pairs(op, boxes, gtboxes, trans, is_cross, mode):
    if boxes.dim() != 2 or gtboxes.dim() != 2 or boxes.shape[0] != 4 or gtboxes.shape[0] != 4:
        _fail(op, f"boxes must be (4, n), got {tuple(boxes.shape)} and {tuple(gtboxes.shape)}")
    if mode not in (0, 1):
        _fail(op, f"mode must be 0 (IoU) or 1 (IoF), got {mode}")
    if not is_cross and boxes.shape[1] != gtboxes.shape[1]:
        _fail(op, f"one-to-one (is_cross=False) needs as many boxes as gtboxes, got {boxes.shape[1]} and "
                  f"{gtboxes.shape[1]}")
    b, g = _xyxy(boxes, trans), _xyxy(gtboxes, trans)
    if is_cross:  # (M, N): ground truth m against box n
        b, g = b[None, :, :], g[:, None, :]
    inter, area_b, area_g = _overlap(b, g)
    union = area_b + area_g - inter
    iou = inter / (union if mode == 0 else area_g)
    ex1, ey1 = torch.minimum(b[..., 0], g[..., 0]), torch.minimum(b[..., 1], g[..., 1])
    ex2, ey2 = torch.maximum(b[..., 2], g[..., 2]), torch.maximum(b[..., 3], g[..., 3])
    return b, g, iou, union, (ex1, ey1, ex2, ey2)


def _one_to_one_row(out, is_cross, dtype):
    return (out if is_cross else out.unsqueeze(0)).to(dtype)


def npu_giou(self, gtboxes, trans=False, is_cross=False, mode=0):
    _, _, iou, union, (ex1, ey1, ex2, ey2) = _pairs("npu_giou", self, gtboxes, trans, is_cross, mode)
    enclose = (ex2 - ex1) * (ey2 - ey1)
    out = iou - (enclose - union) / enclose
    return (out if is_cross else out.unsqueeze(-1)).to(self.dtype)


def _diou(op, boxes, gtboxes, trans, is_cross, mode):
    b, g, iou, _, (ex1, ey1, ex2, ey2) = _pairs(op, boxes, gtboxes, trans, is_cross, mode)
    rho2 = ((b[..., 0] + b[..., 2] - g[..., 0] - g[..., 2]) ** 2
            + (b[..., 1] + b[..., 3] - g[..., 1] - g[..., 3]) ** 2) / 4  # centres' squared distance
    c2 = (ex2 - ex1) ** 2 + (ey2 - ey1) ** 2
    return b, g, iou, iou - rho2 / c2


def npu_diou(self, gtboxes, trans=False, is_cross=False, mode=0):
    _, _, _, out = _diou("npu_diou", self, gtboxes, trans, is_cross, mode)
    return _one_to_one_row(out, is_cross, self.dtype)


def npu_ciou(self, gtboxes, trans=False, is_cross=True, mode=0, atan_sub_flag=False):
    # atan_sub_flag only hands a forward intermediate to Ascend's backward kernel: no effect on the values
    b, g, iou, diou = _diou("npu_ciou", self, gtboxes, trans, is_cross, mode)
    atan_b = torch.atan((b[..., 2] - b[..., 0]) / (b[..., 3] - b[..., 1]))
    atan_g = torch.atan((g[..., 2] - g[..., 0]) / (g[..., 3] - g[..., 1]))
    v = 4 / math.pi ** 2 * (atan_g - atan_b) ** 2
    alpha = (v / (1 - iou + v)).detach()
    return _one_to_one_row(diou - alpha * v, is_cross, self.dtype)


# ---- Faster R-CNN box coding -----------------------------------------------------------------------------------
def _centres(boxes):
    x1, y1, x2, y2 = boxes.unbind(-1)
    w, h = x2 - x1 + 1.0, y2 - y1 + 1.0
    return x1 + 0.5 * (w - 1.0), y1 + 0.5 * (h - 1.0), w, h


def npu_bounding_box_encode(anchor_box, ground_truth_box, means0, means1, means2, means3, stds0, stds1, stds2,
                            stds3):
    op = "npu_bounding_box_encode"
    _rows4(op, "anchor_box", anchor_box)
    if ground_truth_box.shape != anchor_box.shape:
        _fail(op, f"ground_truth_box must match anchor_box {tuple(anchor_box.shape)}, got "
                  f"{tuple(ground_truth_box.shape)}")
    px, py, pw, ph = _centres(_up(anchor_box))
    gx, gy, gw, gh = _centres(_up(ground_truth_box))
    deltas = torch.stack(((gx - px) / pw, (gy - py) / ph, torch.log((gw / pw).abs()), torch.log((gh / ph).abs())), -1)
    means = deltas.new_tensor([means0, means1, means2, means3])
    stds = deltas.new_tensor([stds0, stds1, stds2, stds3])
    return ((deltas - means) / stds).to(anchor_box.dtype)


def npu_bounding_box_decode(rois, deltas, means0, means1, means2, means3, stds0, stds1, stds2, stds3, max_shape,
                            wh_ratio_clip):
    op = "npu_bounding_box_decode"
    _rows4(op, "rois", rois)
    if deltas.shape != rois.shape:
        _fail(op, f"deltas must match rois {tuple(rois.shape)}, got {tuple(deltas.shape)}")
    if len(max_shape) != 2:
        _fail(op, f"max_shape must be [h, w], got {list(max_shape)}")
    d = _up(deltas)
    d = d * d.new_tensor([stds0, stds1, stds2, stds3]) + d.new_tensor([means0, means1, means2, means3])
    limit = abs(math.log(wh_ratio_clip))
    dx, dy, dw, dh = d[:, 0], d[:, 1], d[:, 2].clamp(-limit, limit), d[:, 3].clamp(-limit, limit)
    px, py, pw, ph = _centres(_up(rois))
    gw, gh = pw * dw.exp(), ph * dh.exp()
    gx, gy = px + pw * dx, py + ph * dy
    h, w = max_shape
    x1, x2 = (gx - gw * 0.5 + 0.5).clamp(0, w - 1), (gx + gw * 0.5 - 0.5).clamp(0, w - 1)
    y1, y2 = (gy - gh * 0.5 + 0.5).clamp(0, h - 1), (gy + gh * 0.5 - 0.5).clamp(0, h - 1)
    return torch.stack((x1, y1, x2, y2), -1).to(rois.dtype)


# ---- YOLO ------------------------------------------------------------------------------------------------------
def npu_yolo_boxes_encode(self, gt_bboxes, stride, performance_mode=False):
    # performance_mode picks a faster, less precise Ascend kernel for the same formula
    op = "npu_yolo_boxes_encode"
    _rows4(op, "self", self)
    if gt_bboxes.shape != self.shape or tuple(stride.shape) != (self.shape[0],):
        _fail(op, f"gt_bboxes must be {tuple(self.shape)} and stride ({self.shape[0]},), got "
                  f"{tuple(gt_bboxes.shape)} and {tuple(stride.shape)}")
    b, g, s = _up(self), _up(gt_bboxes), _up(stride)
    cx, cy = (b[:, 0] + b[:, 2]) * 0.5, (b[:, 1] + b[:, 3]) * 0.5
    gcx, gcy = (g[:, 0] + g[:, 2]) * 0.5, (g[:, 1] + g[:, 3]) * 0.5
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    gw, gh = g[:, 2] - g[:, 0], g[:, 3] - g[:, 1]
    tw, th = torch.log((gw / w).clamp(min=_YOLO_EPS)), torch.log((gh / h).clamp(min=_YOLO_EPS))
    tx = ((gcx - cx) / s + 0.5).clamp(_YOLO_EPS, 1 - _YOLO_EPS)
    ty = ((gcy - cy) / s + 0.5).clamp(_YOLO_EPS, 1 - _YOLO_EPS)
    return torch.stack((tx, ty, tw, th), -1).to(self.dtype)


def npu_anchor_response_flags(self, featmap_size, stride, num_base_anchors):
    op = "npu_anchor_response_flags"
    _rows4(op, "self", self)
    if len(featmap_size) != 2 or len(stride) != 2 or num_base_anchors <= 0:
        _fail(op, f"featmap_size and stride need 2 values and num_base_anchors > 0, got {list(featmap_size)}, "
                  f"{list(stride)}, {num_base_anchors}")
    feat_h, feat_w = featmap_size
    g = _up(self)
    gx = torch.floor((g[:, 0] + g[:, 2]) * 0.5 / stride[0]).long()
    gy = torch.floor((g[:, 1] + g[:, 3]) * 0.5 / stride[1]).long()
    inside = (gx >= 0) & (gx < feat_w) & (gy >= 0) & (gy < feat_h)
    cell = torch.where(inside, gy * feat_w + gx, feat_h * feat_w)  # outside: a dropped extra cell
    flags = torch.zeros(feat_h * feat_w + 1, dtype=torch.uint8, device=self.device).index_fill(0, cell, 1)
    return flags[:-1].repeat_interleave(num_base_anchors)


def npu_grid_assign_positive(self, overlaps, box_responsible_flags, max_overlaps, argmax_overlaps, gt_max_overlaps,
                             gt_argmax_overlaps, num_gts, pos_iou_thr, min_pos_iou, gt_max_assign_all):
    op = "npu_grid_assign_positive"
    if self.dim() != 1 or overlaps.dim() != 2 or overlaps.shape[1] != self.shape[0]:
        _fail(op, f"assigned_gt_inds must be (n,) and overlaps (k, n), got {tuple(self.shape)} and "
                  f"{tuple(overlaps.shape)}")
    k = min(num_gts, overlaps.shape[0])  # the real gt count; rows past it are padding
    responsible = box_responsible_flags.bool()
    # step 1: boxes in a responsible cell above pos_iou_thr take their best gt
    pos = (max_overlaps > pos_iou_thr) & responsible
    out = torch.where(pos, argmax_overlaps.to(self.dtype) + 1, self)
    if k == 0:
        return out
    # step 2: each gt (later ones win) takes its best boxes within responsible cells
    gt_ok = (gt_max_overlaps[:k] > min_pos_iou).unsqueeze(1)
    if gt_max_assign_all:
        take = (overlaps[:k] == gt_max_overlaps[:k].unsqueeze(1)) & responsible & gt_ok
    else:
        best = gt_argmax_overlaps[:k].long()
        take = (torch.arange(self.shape[0], device=self.device) == best.unsqueeze(1)) & responsible[best].unsqueeze(1)
        take = take & gt_ok
    rank = torch.arange(1, k + 1, device=self.device).unsqueeze(1)
    last = (take * rank).amax(0)
    return torch.where(last > 0, last.to(self.dtype), out)


_lib = torch.library.Library("npu", "FRAGMENT")
for _schema, _fn in (
        ("npu_iou(Tensor bboxes, Tensor gtboxes, int mode=0) -> Tensor", npu_iou),
        ("npu_ptiou(Tensor bboxes, Tensor gtboxes, int mode=0) -> Tensor", npu_ptiou),
        ("npu_giou(Tensor self, Tensor gtboxes, bool trans=False, bool is_cross=False, int mode=0) -> Tensor",
         npu_giou),
        ("npu_diou(Tensor self, Tensor gtboxes, bool trans=False, bool is_cross=False, int mode=0) -> Tensor",
         npu_diou),
        ("npu_ciou(Tensor self, Tensor gtboxes, bool trans=False, bool is_cross=True, int mode=0, "
         "bool atan_sub_flag=False) -> Tensor", npu_ciou),
        ("npu_bounding_box_encode(Tensor anchor_box, Tensor ground_truth_box, float means0, float means1, "
         "float means2, float means3, float stds0, float stds1, float stds2, float stds3) -> Tensor",
         npu_bounding_box_encode),
        ("npu_bounding_box_decode(Tensor rois, Tensor deltas, float means0, float means1, float means2, "
         "float means3, float stds0, float stds1, float stds2, float stds3, int[1] max_shape, float wh_ratio_clip) "
         "-> Tensor", npu_bounding_box_decode),
        ("npu_yolo_boxes_encode(Tensor self, Tensor gt_bboxes, Tensor stride, bool performance_mode=False) -> Tensor",
         npu_yolo_boxes_encode),
        ("npu_anchor_response_flags(Tensor self, int[2] featmap_size, int[2] stride, int num_base_anchors) -> Tensor",
         npu_anchor_response_flags),
        ("npu_grid_assign_positive(Tensor self, Tensor overlaps, Tensor box_responsible_flags, Tensor max_overlaps, "
         "Tensor argmax_overlaps, Tensor gt_max_overlaps, Tensor gt_argmax_overlaps, int num_gts, float pos_iou_thr, "
         "float min_pos_iou, bool gt_max_assign_all) -> Tensor", npu_grid_assign_positive)):
    _lib.define(_schema)
    _lib.impl(_schema.split("(", 1)[0], _fn, "CompositeImplicitAutograd")
