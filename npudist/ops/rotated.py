"""torch_npu's rotated-box operators. Angles are in degrees (the unit the documented coder examples compute in).

* ``npu_rotated_box_encode(anchor_box, gt_bboxes, weight)`` / ``npu_rotated_box_decode(anchor_boxes, deltas,
  weight)``: boxes (B, 5, N) as ``[x1, y1, x2, y2, angle]`` (what the documented examples compute). Encoding::

      dx = (gx - ax) / aw,  dy = (gy - ay) / ah,  dw = log(gw / aw),  dh = log(gh / ah),
      da = tan(g_angle) - tan(a_angle)                   (x, y: centres; w = x2 - x1, h = y2 - y1)

  each times its ``weight``; decoding divides by the weights and inverts (angle = atan(tan(a_angle) + da)).
* ``npu_rotated_overlaps(self, query_boxes, trans=False)`` -> (B, N, K): the intersection areas of the rotated
  boxes (B, N, 5) and (B, K, 5), ``[x_center, y_center, w, h, angle]`` (``trans=True``: ``[x1, y1, x2, y2,
  angle]``), rotated about their centres; the intersection polygon is the two boxes' corners inside the other box
  and their edges' crossings, ordered around their centroid (shoelace area).
* ``npu_rotated_iou(self, query_boxes, trans=False, mode=0, is_cross=True, v_threshold=0., e_threshold=0.)``:
  ``overlap / union`` (mode 0) or ``overlap / area(query box)`` (mode 1, IoF), (B, N, K) when ``is_cross`` else
  the (B, N) pairs; ``v_threshold``/``e_threshold`` relax Ascend's vertex and edge tests and have no effect on
  this exact computation.
* ``npu_nms_rotated(dets, scores, iou_threshold, scores_threshold=0, max_output_size=-1, mode=0)`` ->
  ``(selected_index, selected_num)``: greedy NMS (as npudist/ops/nms.py) with the rotated IoU of ``[x, y, w, h,
  angle]`` boxes; candidates scoring above ``scores_threshold``; int32 indices and their count ((1,), int32).
"""
from __future__ import annotations

import torch
from torch.library import custom_op

from npudist.ops.nms import greedy_nms

_INSIDE_EPS = 1e-6


def _fail(op, msg):
    raise ValueError(f"{op}: {msg}")


def _up(x):
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


# ---- coders ----------------------------------------------------------------------------------------------------
def _check_coder(op, a, b, weight):
    if a.dim() != 3 or a.shape[1] != 5 or b.shape != a.shape:
        _fail(op, f"boxes must both be (B, 5, N), got {tuple(a.shape)} and {tuple(b.shape)}")
    if tuple(weight.shape) != (5,):
        _fail(op, f"weight must be (5,), got {tuple(weight.shape)}")


def _split(boxes):
    x1, y1, x2, y2, angle = _up(boxes).unbind(1)
    return (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, angle


def npu_rotated_box_encode(self, gt_bboxes, weight):
    _check_coder("npu_rotated_box_encode", self, gt_bboxes, weight)
    ax, ay, aw, ah, aa = _split(self)
    gx, gy, gw, gh, ga = _split(gt_bboxes)
    d = torch.stack(((gx - ax) / aw, (gy - ay) / ah, torch.log(gw / aw), torch.log(gh / ah),
                     torch.tan(torch.deg2rad(ga)) - torch.tan(torch.deg2rad(aa))), 1)
    return (d * _up(weight).view(1, 5, 1)).to(self.dtype)


def npu_rotated_box_decode(self, deltas, weight):
    _check_coder("npu_rotated_box_decode", self, deltas, weight)
    ax, ay, aw, ah, aa = _split(self)
    dx, dy, dw, dh, da = (_up(deltas) / _up(weight).view(1, 5, 1)).unbind(1)
    gx, gy = ax + dx * aw, ay + dy * ah
    gw, gh = aw * torch.exp(dw), ah * torch.exp(dh)
    ga = torch.rad2deg(torch.atan(torch.tan(torch.deg2rad(aa)) + da))
    return torch.stack((gx - gw / 2, gy - gh / 2, gx + gw / 2, gy + gh / 2, ga), 1).to(self.dtype)


# ---- rotated intersection ---------------------------------------------------------------------------------------
def _corners(boxes, trans):
    """(..., 5) boxes -> (..., 4, 2) corners, counter-clockwise."""
    b = _up(boxes)
    if trans:
        x1, y1, x2, y2, angle = b.unbind(-1)
        cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
    else:
        cx, cy, w, h, angle = b.unbind(-1)
    t = torch.deg2rad(angle)
    cos, sin = torch.cos(t), torch.sin(t)
    sx = torch.tensor([-0.5, 0.5, 0.5, -0.5], dtype=b.dtype, device=b.device)
    sy = torch.tensor([-0.5, -0.5, 0.5, 0.5], dtype=b.dtype, device=b.device)
    dx, dy = w[..., None] * sx, h[..., None] * sy
    return torch.stack((cx[..., None] + dx * cos[..., None] - dy * sin[..., None],
                        cy[..., None] + dx * sin[..., None] + dy * cos[..., None]), -1)


def _cross(a, b):
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside(points, quad):
    """Whether each of points (..., P, 2) lies in the convex counter-clockwise quad (..., 4, 2)."""
    edges = quad.roll(-1, -2) - quad                                   # (..., 4, 2)
    rel = points[..., :, None, :] - quad[..., None, :, :]              # (..., P, 4, 2)
    scale = edges.norm(dim=-1)[..., None, :] * rel.norm(dim=-1) + 1.0
    return (_cross(edges[..., None, :, :], rel) >= -_INSIDE_EPS * scale).all(-1)


def _edge_crossings(qa, qb):
    """The 16 crossings of qa's and qb's edges (..., 16, 2) and whether each exists."""
    a0, a1 = qa[..., :, None, :], qa.roll(-1, -2)[..., :, None, :]
    b0, b1 = qb[..., None, :, :], qb.roll(-1, -2)[..., None, :, :]
    da, db = a1 - a0, b1 - b0
    denom = _cross(da, db)
    ok = denom.abs() > 1e-12
    safe = torch.where(ok, denom, torch.ones_like(denom))
    t = _cross(b0 - a0, db) / safe
    u = _cross(b0 - a0, da) / safe
    hit = ok & (t >= 0) & (t <= 1) & (u >= 0) & (u <= 1)
    pts = a0 + t[..., None] * da
    return pts.flatten(-3, -2), hit.flatten(-2)


def _intersection_area(qa, qb):
    """Area of the intersection of convex quads qa, qb (..., 4, 2)."""
    cross_pts, cross_ok = _edge_crossings(qa, qb)
    pts = torch.cat((qa, qb, cross_pts), -2)                          # (..., 24, 2)
    ok = torch.cat((_inside(qa, qb), _inside(qb, qa), cross_ok), -1)  # (..., 24)
    count = ok.sum(-1, keepdim=True)
    w = ok.to(pts.dtype)
    centre = (pts * w[..., None]).sum(-2) / count.clamp(min=1).to(pts.dtype)
    rel = pts - centre[..., None, :]
    angle = torch.where(ok, torch.atan2(rel[..., 1], rel[..., 0]), torch.full_like(w, 10.0))  # invalid: last
    order = angle.argsort(-1)
    rel = rel.gather(-2, order[..., None].expand_as(rel))
    pos = torch.arange(pts.shape[-2], device=pts.device)
    nxt = torch.where(pos + 1 < count, pos + 1, torch.zeros_like(pos))  # the last valid point closes on the first
    rel_next = rel.gather(-2, nxt[..., None].expand_as(rel))
    area = 0.5 * (_cross(rel, rel_next) * (pos < count)).sum(-1)
    return torch.where(count.squeeze(-1) >= 3, area.abs(), torch.zeros_like(area))


def _pair_quads(op, boxes, query, trans, is_cross):
    if boxes.dim() != 3 or query.dim() != 3 or boxes.shape[2] != 5 or query.shape[2] != 5 \
            or boxes.shape[0] != query.shape[0]:
        _fail(op, f"boxes must be (B, N, 5) and (B, K, 5), got {tuple(boxes.shape)} and {tuple(query.shape)}")
    if not is_cross and boxes.shape[1] != query.shape[1]:
        _fail(op, f"one-to-one (is_cross=False) needs N == K, got {boxes.shape[1]} and {query.shape[1]}")
    qa, qb = _corners(boxes, trans), _corners(query, trans)
    if is_cross:
        qa, qb = qa[:, :, None], qb[:, None, :]
        qa, qb = torch.broadcast_tensors(qa, qb)
    return qa, qb


def _area(quad):
    return 0.5 * _cross(quad, quad.roll(-1, -2)).sum(-1).abs()


def npu_rotated_overlaps(self, query_boxes, trans=False):
    qa, qb = _pair_quads("npu_rotated_overlaps", self, query_boxes, trans, True)
    return _intersection_area(qa, qb).to(self.dtype)


def npu_rotated_iou(self, query_boxes, trans=False, mode=0, is_cross=True, v_threshold=0.0, e_threshold=0.0):
    if mode not in (0, 1):
        _fail("npu_rotated_iou", f"mode must be 0 (IoU) or 1 (IoF), got {mode}")
    qa, qb = _pair_quads("npu_rotated_iou", self, query_boxes, trans, is_cross)
    inter = _intersection_area(qa, qb)
    area_a, area_b = _area(qa), _area(qb)
    denom = area_a + area_b - inter if mode == 0 else area_b
    return torch.where(denom > 0, inter / torch.where(denom > 0, denom, 1.0), 0.0).to(self.dtype)


# ---- rotated NMS ----------------------------------------------------------------------------------------------------
def _check_nms(dets, scores, mode):
    op = "npu_nms_rotated"
    if mode != 0:
        _fail(op, f"mode {mode}: only 0 ([x, y, w, h, angle]) is supported (as Ascend documents)")
    if dets.dim() != 2 or dets.shape[1] != 5 or tuple(scores.shape) != (dets.shape[0],):
        _fail(op, f"dets must be (num_boxes, 5) and scores (num_boxes,), got {tuple(dets.shape)} and "
                  f"{tuple(scores.shape)}")


@custom_op("npu::npu_nms_rotated", mutates_args=(), device_types="npu", schema=(
    "(Tensor self, Tensor scores, float iou_threshold, float scores_threshold=0, int max_output_size=-1, "
    "int mode=0) -> (Tensor, Tensor)"))
def npu_nms_rotated(dets, scores, iou_threshold, scores_threshold=0.0, max_output_size=-1, mode=0):
    _check_nms(dets, scores, mode)
    d = dets.detach().to("cpu", torch.float64)[None]
    iou = npu_rotated_iou(d, d)[0].numpy()
    s = scores.detach().to("cpu", torch.float64).numpy()
    kept = greedy_nms(iou, s, s > scores_threshold, iou_threshold, max_output_size) if max_output_size else []
    return (torch.tensor(kept, dtype=torch.int32, device=dets.device),
            torch.tensor([len(kept)], dtype=torch.int32, device=dets.device))


@npu_nms_rotated.register_fake
def _(dets, scores, iou_threshold, scores_threshold=0.0, max_output_size=-1, mode=0):
    _check_nms(dets, scores, mode)
    n = torch.library.get_ctx().new_dynamic_size()
    return dets.new_empty(n, dtype=torch.int32), dets.new_empty(1, dtype=torch.int32)


_lib = torch.library.Library("npu", "FRAGMENT")
for _schema, _fn in (
        ("npu_rotated_box_encode(Tensor self, Tensor gt_bboxes, Tensor weight) -> Tensor", npu_rotated_box_encode),
        ("npu_rotated_box_decode(Tensor self, Tensor deltas, Tensor weight) -> Tensor", npu_rotated_box_decode),
        ("npu_rotated_overlaps(Tensor self, Tensor query_boxes, bool trans=False) -> Tensor", npu_rotated_overlaps),
        ("npu_rotated_iou(Tensor self, Tensor query_boxes, bool trans=False, int mode=0, bool is_cross=True, "
         "float v_threshold=0.0, float e_threshold=0.0) -> Tensor", npu_rotated_iou)):
    _lib.define(_schema)
    _lib.impl(_schema.split("(", 1)[0], _fn, "CompositeImplicitAutograd")
