"""torch_npu's non-maximum suppression operators: greedy NMS on the host copy of the scores (npu memory is host
memory), as custom operators with an npu kernel and a fake kernel (data-dependent output lengths are dynamic
sizes); they have no gradient.

Greedy NMS: candidates in descending score order (ties: lower index first); a candidate is kept unless its IoU
with an already kept box exceeds the threshold; boxes are ``[x1, y1, x2, y2]`` with areas ``(x2 - x1)(y2 - y1)``
(corners in either order; an empty box overlaps nothing).

* ``npu_nms_v4(boxes, scores, max_output_size, iou_threshold, scores_threshold, pad_to_max_output_size=False)``
  -> ``(selected_indices, valid_outputs)``: TensorFlow's NonMaxSuppressionV4 -- candidates with a score above
  ``scores_threshold``, at most ``max_output_size`` kept; int32 indices (padded with 0 to ``max_output_size`` when
  asked) and their count (int32, 0-D).
* ``npu_nms_with_mask(input, iou_threshold)`` -> ``(selected_boxes, selected_idx, selected_mask)``: rows
  ``[x1, y1, x2, y2, score, ...]`` (Ascend pads them to 8 columns) sorted by score: the (N, 5) sorted boxes with
  their scores, the sorted rows' original indices (int32) and whether each was kept (uint8).
* ``npu_batch_nms(self, scores, score_threshold, iou_threshold, max_size_per_class, max_total_size, ...)``:
  TensorFlow's combined NMS: per batch and class (boxes ``[B, N, q, 4]`` shared by the classes when q = 1),
  candidates scoring above ``score_threshold``, at most ``max_size_per_class`` kept per class; the kept boxes of
  all classes sorted by score, the first ``max_total_size``: boxes, scores and classes (float, as the scores),
  zero padded, and the count per batch (int32).
"""
from __future__ import annotations

import numpy as np
import torch
from torch.library import custom_op


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def box_iou_matrix(boxes: torch.Tensor) -> np.ndarray:
    """Pairwise IoU of (n, 4) corner boxes as a float64 numpy matrix (0 where either box is empty)."""
    b = boxes.detach().to("cpu", torch.float64)
    x1, x2 = torch.minimum(b[:, 0], b[:, 2]), torch.maximum(b[:, 0], b[:, 2])
    y1, y2 = torch.minimum(b[:, 1], b[:, 3]), torch.maximum(b[:, 1], b[:, 3])
    area = (x2 - x1) * (y2 - y1)
    w = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None])).clamp(min=0)
    h = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None])).clamp(min=0)
    inter = w * h
    union = area[:, None] + area[None] - inter
    valid = (area[:, None] > 0) & (area[None] > 0)
    return torch.where(valid, inter / torch.where(valid, union, 1.0), 0.0).numpy()


def greedy_nms(iou: np.ndarray, scores: np.ndarray, candidates: np.ndarray, threshold: float, limit: int) -> list:
    """Indices kept by greedy NMS among ``candidates`` (a bool mask), best score first, at most ``limit`` (< 0: all)."""
    order = [int(i) for i in np.argsort(-scores, kind="stable") if candidates[i]]
    suppressed = np.zeros(len(scores), dtype=bool)
    kept = []
    for i in order:
        if suppressed[i]:
            continue
        kept.append(i)
        if len(kept) == limit:
            break
        suppressed |= iou[i] > threshold
    return kept


def _host(t):
    return t.detach().to("cpu", torch.float64).numpy()


# ---- NonMaxSuppressionV4 ----------------------------------------------------------------------------------------
def _check_v4(boxes, scores, max_output_size, iou_threshold, scores_threshold):
    op = "npu_nms_v4"
    if boxes.dim() != 2 or boxes.shape[1] != 4 or tuple(scores.shape) != (boxes.shape[0],):
        _fail(op, f"boxes must be (num_boxes, 4) and scores (num_boxes,), got {tuple(boxes.shape)} and "
                  f"{tuple(scores.shape)}")
    if iou_threshold.numel() != 1 or scores_threshold.numel() != 1:
        _fail(op, "iou_threshold and scores_threshold must be 0-D tensors")
    if int(max_output_size) < 0:
        _fail(op, f"max_output_size must be >= 0, got {max_output_size}")


@custom_op("npu::npu_nms_v4", mutates_args=(), device_types="npu", schema=(
    "(Tensor self, Tensor scores, Scalar max_output_size, Tensor iou_threshold, Tensor scores_threshold, "
    "bool pad_to_max_output_size=False) -> (Tensor, Tensor)"))
def npu_nms_v4(boxes, scores, max_output_size, iou_threshold, scores_threshold, pad_to_max_output_size=False):
    _check_v4(boxes, scores, max_output_size, iou_threshold, scores_threshold)
    limit = int(max_output_size)
    s = _host(scores)
    kept = greedy_nms(box_iou_matrix(boxes), s, s > float(scores_threshold), float(iou_threshold), limit) \
        if limit else []
    out = kept + [0] * (limit - len(kept)) if pad_to_max_output_size else kept
    return (torch.tensor(out, dtype=torch.int32, device=boxes.device),
            torch.tensor(len(kept), dtype=torch.int32, device=boxes.device))


@npu_nms_v4.register_fake
def _(boxes, scores, max_output_size, iou_threshold, scores_threshold, pad_to_max_output_size=False):
    _check_v4(boxes, scores, max_output_size, iou_threshold, scores_threshold)
    limit = int(max_output_size)
    n = limit if pad_to_max_output_size else torch.library.get_ctx().new_dynamic_size(max=max(limit, 2))
    return boxes.new_empty(n, dtype=torch.int32), boxes.new_empty((), dtype=torch.int32)


# ---- NMSWithMask ---------------------------------------------------------------------------------------------
def _check_with_mask(x):
    if x.dim() != 2 or x.shape[1] not in (5, 8):
        _fail("npu_nms_with_mask", f"input must be (N, 8) rows [x1, y1, x2, y2, score, padding...] (or (N, 5)), "
                                   f"got {tuple(x.shape)}")


@custom_op("npu::npu_nms_with_mask", mutates_args=(), device_types="npu",
           schema="(Tensor input, Scalar iou_threshold) -> (Tensor, Tensor, Tensor)")
def npu_nms_with_mask(x, iou_threshold):
    _check_with_mask(x)
    s = _host(x[:, 4])
    order = torch.from_numpy(np.argsort(-s, kind="stable").copy()).to(x.device)
    kept = greedy_nms(box_iou_matrix(x[:, :4]), s, np.ones(len(s), dtype=bool), float(iou_threshold), -1)
    mask = torch.zeros(x.shape[0], dtype=torch.uint8)
    rank = {int(i): r for r, i in enumerate(order.tolist())}
    for i in kept:
        mask[rank[i]] = 1
    return x[order, :5].clone(), order.to(torch.int32), mask.to(x.device)


@npu_nms_with_mask.register_fake
def _(x, iou_threshold):
    _check_with_mask(x)
    n = x.shape[0]
    return x.new_empty(n, 5), x.new_empty(n, dtype=torch.int32), x.new_empty(n, dtype=torch.uint8)


# ---- combined (batch, multi-class) NMS -----------------------------------------------------------------------
def _check_batch(boxes, scores, max_size_per_class, max_total_size, change_coordinate_frame, transpose_box):
    op = "npu_batch_nms"
    if change_coordinate_frame:
        _fail(op, "change_coordinate_frame normalises to a clip window, which torch_npu's call cannot pass; use False")
    if transpose_box:
        _fail(op, "transpose_box (boxes in a 4, N layout) has no documented full shape; pass boxes as "
                  "[batch, num_anchors, q, 4]")
    if boxes.dim() != 4 or boxes.shape[3] != 4 or scores.dim() != 3:
        _fail(op, f"boxes must be [batch, num_anchors, q, 4] and scores [batch, num_anchors, num_classes], got "
                  f"{tuple(boxes.shape)} and {tuple(scores.shape)}")
    if scores.shape[:2] != boxes.shape[:2] or boxes.shape[2] not in (1, scores.shape[2]):
        _fail(op, f"scores {tuple(scores.shape)} must match boxes {tuple(boxes.shape)} in batch and anchors, with "
                  f"q = 1 or q = num_classes")
    if max_size_per_class <= 0 or max_total_size <= 0:
        _fail(op, f"max_size_per_class and max_total_size must be positive, got {max_size_per_class}, "
                  f"{max_total_size}")


@custom_op("npu::npu_batch_nms", mutates_args=(), device_types="npu", schema=(
    "(Tensor self, Tensor scores, float score_threshold, float iou_threshold, int max_size_per_class, "
    "int max_total_size, bool change_coordinate_frame=False, bool transpose_box=False) "
    "-> (Tensor, Tensor, Tensor, Tensor)"))
def npu_batch_nms(boxes, scores, score_threshold, iou_threshold, max_size_per_class, max_total_size,
                  change_coordinate_frame=False, transpose_box=False):
    _check_batch(boxes, scores, max_size_per_class, max_total_size, change_coordinate_frame, transpose_box)
    batch, _, q, _ = boxes.shape
    classes = scores.shape[2]
    out_boxes = torch.zeros(batch, max_total_size, 4, dtype=boxes.dtype)
    out_scores = torch.zeros(batch, max_total_size, dtype=scores.dtype)
    out_classes = torch.zeros(batch, max_total_size, dtype=scores.dtype)
    out_num = torch.zeros(batch, dtype=torch.int32)
    host_boxes, host_scores = boxes.detach().cpu(), scores.detach().cpu()
    for b in range(batch):
        picked = []  # (score, class, anchor)
        ious = [box_iou_matrix(host_boxes[b, :, c]) for c in range(q)]
        for c in range(classes):
            s = host_scores[b, :, c].double().numpy()
            kept = greedy_nms(ious[0 if q == 1 else c], s, s > score_threshold, iou_threshold, max_size_per_class)
            picked += [(s[i], c, i) for i in kept]
        picked.sort(key=lambda p: -p[0])  # stable: class order, then selection order among equal scores
        picked = picked[:max_total_size]
        for j, (_, c, i) in enumerate(picked):
            out_boxes[b, j] = host_boxes[b, i, 0 if q == 1 else c]
            out_scores[b, j] = host_scores[b, i, c]
            out_classes[b, j] = c
        out_num[b] = len(picked)
    dev = boxes.device
    return out_boxes.to(dev), out_scores.to(dev), out_classes.to(dev), out_num.to(dev)


@npu_batch_nms.register_fake
def _(boxes, scores, score_threshold, iou_threshold, max_size_per_class, max_total_size,
      change_coordinate_frame=False, transpose_box=False):
    _check_batch(boxes, scores, max_size_per_class, max_total_size, change_coordinate_frame, transpose_box)
    b = boxes.shape[0]
    return (boxes.new_empty(b, max_total_size, 4), scores.new_empty(b, max_total_size),
            scores.new_empty(b, max_total_size), boxes.new_empty(b, dtype=torch.int32))
