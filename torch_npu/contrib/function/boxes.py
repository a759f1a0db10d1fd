"""Anchor flags and box coders of detection heads (mmdetection's YOLO and delta-xywh coders) over torch_npu's
``npu_anchor_response_flags``, ``npu_yolo_boxes_encode`` and ``npu_bounding_box_encode/decode``.

Boxes of another floating dtype than float16/float32 compute in float32 (the operators' dtypes)."""
from __future__ import annotations

import torch

import torch_npu


def _box(t):
    return t if t.dtype in (torch.float32, torch.float16) else t.float()


def _check_pair(op, a, b, names):
    if a.dim() != 2 or a.shape[-1] != 4 or b.shape != a.shape:
        raise ValueError(f"{op}: {names[0]} and {names[1]} must both be (n, 4), got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")


def _four(op, name, values, default):
    values = default if values is None else list(values)
    if len(values) != 4:
        raise ValueError(f"{op}: {name} needs 4 values (x, y, w, h), got {values}")
    return [float(v) for v in values]


def npu_single_level_responsible_flags(featmap_size, gt_bboxes, stride, num_base_anchors):
    """uint8 flags (featmap_size[0] * featmap_size[1] * num_base_anchors,): 1 for the anchors of the feature-map
    cell holding a ground-truth box's centre."""
    return torch_npu.npu_anchor_response_flags(_box(gt_bboxes), list(featmap_size), list(stride),
                                                   num_base_anchors)


def npu_bbox_coder_encode_yolo(bboxes, gt_bboxes, stride):
    """YOLO deltas (n, 4) from anchors ``bboxes`` to ``gt_bboxes`` (both (n, 4) xyxy) at int ``stride`` (n,)."""
    _check_pair("npu_bbox_coder_encode_yolo", bboxes, gt_bboxes, ("bboxes", "gt_bboxes"))
    if stride.dim() != 1 or stride.shape[0] != bboxes.shape[0]:
        raise ValueError(f"npu_bbox_coder_encode_yolo: stride must be (n,) = ({bboxes.shape[0]},), "
                         f"got {tuple(stride.shape)}")
    return torch_npu.npu_yolo_boxes_encode(_box(bboxes), _box(gt_bboxes), stride.int(), False)


def npu_bbox_coder_encode_xyxy2xywh(bboxes, gt_bboxes, means=None, stds=None, is_normalized=False,
                                    normalized_scale=10000.):
    """Deltas ``((dx, dy, dw, dh) - means) / stds`` from ``bboxes`` to ``gt_bboxes`` (xyxy, (n, 4)); normalised
    coordinates are first scaled back by ``normalized_scale``."""
    op = "npu_bbox_coder_encode_xyxy2xywh"
    _check_pair(op, bboxes, gt_bboxes, ("bboxes", "gt_bboxes"))
    m, s = _four(op, "means", means, [0.] * 4), _four(op, "stds", stds, [1.] * 4)
    bboxes, gt_bboxes = _box(bboxes), _box(gt_bboxes)
    if is_normalized:
        bboxes, gt_bboxes = bboxes * normalized_scale, gt_bboxes * normalized_scale
    return torch_npu.npu_bounding_box_encode(bboxes, gt_bboxes, *m, *s)


def npu_bbox_coder_decode_xywh2xyxy(bboxes, pred_bboxes, means=None, stds=None, max_shape=None,
                                    wh_ratio_clip=16 / 1000):
    """Boxes (n, 4) xyxy from anchors ``bboxes`` and deltas ``pred_bboxes``: the inverse of the encoder, clipped
    to ``max_shape`` (H, W; default 9999 x 9999) with width/height ratios limited by ``wh_ratio_clip``."""
    op = "npu_bbox_coder_decode_xywh2xyxy"
    _check_pair(op, bboxes, pred_bboxes, ("bboxes", "pred_bboxes"))
    m, s = _four(op, "means", means, [0.] * 4), _four(op, "stds", stds, [1.] * 4)
    shape = [9999, 9999] if max_shape is None else [int(v) for v in max_shape]
    if len(shape) != 2:
        raise ValueError(f"{op}: max_shape must be (H, W), got {max_shape}")
    return torch_npu.npu_bounding_box_decode(_box(bboxes), _box(pred_bboxes), *m, *s, shape, wh_ratio_clip)
