"""Multi-class NMS of detection heads (mmdetection's ``multiclass_nms`` contract) over ``npu_batch_nms``.

``multi_scores``' last column is the background class and takes no part; ``score_factors`` multiply the scores
first; per class, boxes scoring above ``score_thr`` go through greedy NMS at IoU ``nms_thr``; the survivors of all
classes, best first, fill ``max_num`` rows and the rest are zero. Boxes are shared by all classes ((n, 4)) or one
per class ((n, #class, 4)). Scores keep the input dtype (Ascend's kernel computes in float16)."""
from __future__ import annotations

import torch

import torch_npu


def _scores(multi_scores, score_factors):
    scores = multi_scores[..., :-1]
    return scores if score_factors is None else scores * score_factors[..., None]


def _check(op, multi_bboxes, multi_scores, max_num, batched):
    want = 3 if batched else 2
    if multi_scores.dim() != want or multi_scores.shape[-1] < 2:
        raise ValueError(f"{op}: multi_scores must be {'(bs, n, #class+1)' if batched else '(n, #class+1)'} with "
                         f"a background column, got {tuple(multi_scores.shape)}")
    lead = multi_scores.shape[:-1]
    if multi_bboxes.shape[:want - 1] != lead or multi_bboxes.shape[-1] != 4:
        raise ValueError(f"{op}: multi_bboxes {tuple(multi_bboxes.shape)} must be (..., n, 4) or (..., n, #class, 4) "
                         f"for multi_scores {tuple(multi_scores.shape)}")
    if max_num <= 0:
        raise ValueError(f"{op}: max_num must be positive (the output is padded to it), got {max_num}")


def _nms(multi_bboxes, scores, score_thr, nms_thr, max_num):
    bs, n, classes = scores.shape
    boxes = multi_bboxes.reshape(bs, n, -1, 4)
    boxes, scores_, labels, _ = torch_npu.npu_batch_nms(boxes, scores, score_thr, nms_thr, max_num, max_num)
    return torch.cat([boxes, scores_[..., None]], -1), labels


def npu_multiclass_nms(multi_bboxes, multi_scores, score_thr=0.05, nms_thr=0.45, max_num=50, score_factors=None):
    """-> (dets (max_num, 5) ``[x1, y1, x2, y2, score]``, labels (max_num,), 0-based)."""
    _check("npu_multiclass_nms", multi_bboxes, multi_scores, max_num, batched=False)
    dets, labels = _nms(multi_bboxes[None], _scores(multi_scores, score_factors)[None], score_thr, nms_thr, max_num)
    return dets[0], labels[0]


def npu_batched_multiclass_nms(multi_bboxes, multi_scores, score_thr=0.05, nms_thr=0.45, max_num=50,
                               score_factors=None):
    """-> (dets (bs, max_num, 5), labels (bs, max_num)), each image on its own."""
    _check("npu_batched_multiclass_nms", multi_bboxes, multi_scores, max_num, batched=True)
    return _nms(multi_bboxes, _scores(multi_scores, score_factors), score_thr, nms_thr, max_num)
