"""torch_npu's NMS and rotated-box operators against references written here from its documentation: plain greedy
NMS loops, Sutherland-Hodgman polygon clipping for the rotated overlaps, and the documented examples."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops

OPCHECK = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def _iou(a, b):
    """Axis-aligned IoU of two [x1, y1, x2, y2] lists (0 for an empty box)."""
    aa, ab = (a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1])
    if aa <= 0 or ab <= 0:
        return 0.0
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return inter / (aa + ab - inter)


def _greedy(boxes, scores, thr, score_thr, limit, iou=_iou):
    order = sorted((i for i in range(len(scores)) if scores[i] > score_thr), key=lambda i: (-scores[i], i))
    kept = []
    for i in order:
        if len(kept) == limit:
            break
        if all(iou(boxes[i], boxes[j]) <= thr for j in kept):
            kept.append(i)
    return kept


def _random_boxes(n, seed, scale=20.0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * scale
    return torch.cat((xy, xy + torch.rand(n, 2, generator=g) * scale / 2 + 1), 1)


# ---- NMS -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pad", [False, True])
def test_nms_v4(pad):
    boxes, scores = _random_boxes(60, 1), torch.rand(60, generator=torch.Generator().manual_seed(2))
    idx, num = torch_npu.npu_nms_v4(boxes.to(NPU), scores.to(NPU), 10, torch.tensor(0.3).to(NPU),
                                    torch.tensor(0.2).to(NPU), pad)
    ref = _greedy(boxes.tolist(), scores.tolist(), 0.3, 0.2, 10)
    assert idx.dtype == num.dtype == torch.int32 and num.shape == () and num.item() == len(ref)
    assert idx.cpu().tolist() == (ref + [0] * (10 - len(ref)) if pad else ref)


def test_nms_with_mask():
    rows = torch.tensor([[0.0, 1.0, 2.0, 3.0, 0.6, 0.5, 0.4, 0.3], [6.0, 7.0, 8.0, 9.0, 0.4, 0.5, 0.6, 0.7]],
                        dtype=torch.float16)
    boxes, idx, mask = torch_npu.npu_nms_with_mask(rows.to(NPU), 0.5)  # the documented example
    torch.testing.assert_close(boxes.cpu(), rows[:, :5])
    assert idx.dtype == torch.int32 and idx.cpu().tolist() == [0, 1] and mask.cpu().tolist() == [1, 1]
    b, s = _random_boxes(12, 3), torch.rand(12, generator=torch.Generator().manual_seed(4))
    rows = torch.cat((b, s[:, None], torch.zeros(12, 3)), 1)
    boxes, idx, mask = torch_npu.npu_nms_with_mask(rows.to(NPU), 0.2)
    order = sorted(range(12), key=lambda i: (-s[i].item(), i))
    kept = set(_greedy(b.tolist(), s.tolist(), 0.2, -1.0, -1))
    assert idx.cpu().tolist() == order
    torch.testing.assert_close(boxes.cpu(), rows[order, :5])
    assert mask.dtype == torch.uint8 and mask.cpu().tolist() == [int(i in kept) for i in order]


@pytest.mark.parametrize("q", [1, 3])
def test_batch_nms(q):
    batch, n, classes = 2, 9, 3
    boxes = torch.stack([torch.stack([_random_boxes(n, 10 * b + c) for c in range(q)], 1) for b in range(batch)])
    scores = torch.rand(batch, n, classes, generator=torch.Generator().manual_seed(5))
    out_b, out_s, out_c, out_n = torch_npu.npu_batch_nms(boxes.to(NPU), scores.to(NPU), 0.3, 0.4, 3, 7)
    assert out_b.shape == (batch, 7, 4) and out_s.shape == out_c.shape == (batch, 7) and out_n.dtype == torch.int32
    for b in range(batch):
        picked = []
        for c in range(classes):
            cb = boxes[b, :, 0 if q == 1 else c].tolist()
            picked += [(scores[b, i, c].item(), c, i) for i in _greedy(cb, scores[b, :, c].tolist(), 0.4, 0.3, 3)]
        picked = sorted(picked, key=lambda p: -p[0])[:7]
        assert out_n[b].item() == len(picked)
        for j, (sc, c, i) in enumerate(picked):
            assert out_s[b, j].item() == pytest.approx(sc) and out_c[b, j].item() == c
            assert out_b[b, j].cpu().tolist() == boxes[b, i, 0 if q == 1 else c].tolist()
        assert not out_b[b, len(picked):].cpu().any() and not out_s[b, len(picked):].cpu().any()
    with pytest.raises(ValueError, match="change_coordinate_frame"):
        torch_npu.npu_batch_nms(boxes.to(NPU), scores.to(NPU), 0.3, 0.4, 3, 7, True)


# ---- rotated boxes -------------------------------------------------------------------------------------------
def test_rotated_box_coders_documented_examples():
    w = torch.ones(5, dtype=torch.float16).to(NPU)
    anchor = torch.tensor([[[30.69], [32.6], [45.94], [59.88], [-44.53]]], dtype=torch.float16)
    gt = torch.tensor([[[30.44], [18.72], [33.22], [45.56], [8.5]]], dtype=torch.float16)
    enc = torch_npu.npu_rotated_box_encode(anchor.to(NPU), gt.to(NPU), w)
    torch.testing.assert_close(enc.cpu().flatten().float(), torch.tensor([-0.4253, -0.5166, -1.7021, -0.0162, 1.1328]),
                               atol=2e-3, rtol=0)
    anchor = torch.tensor([[[4.137], [33.72], [29.4], [54.06], [41.28]]], dtype=torch.float16)
    deltas = torch.tensor([[[0.0244], [-1.992], [0.2109], [0.315], [-37.25]]], dtype=torch.float16)
    dec = torch_npu.npu_rotated_box_decode(anchor.to(NPU), deltas.to(NPU), w)
    torch.testing.assert_close(dec.cpu().flatten().float(), torch.tensor([1.7861, -10.5781, 33.0, 17.2969, -88.4375]),
                               atol=3e-2, rtol=0)


def test_rotated_box_encode_decode_round_trip_with_weights():
    g = torch.Generator().manual_seed(6)
    xy = torch.rand(2, 2, 4, generator=g, dtype=torch.float64) * 50
    wh = torch.rand(2, 2, 4, generator=g, dtype=torch.float64) * 20 + 1
    anchor = torch.cat((xy, xy + wh, torch.rand(2, 1, 4, generator=g, dtype=torch.float64) * 160 - 80), 1)
    gt = anchor + torch.rand(2, 5, 4, generator=g, dtype=torch.float64)
    weight = torch.tensor([10.0, 10.0, 5.0, 5.0, 1.0], dtype=torch.float64)
    enc = torch_npu.npu_rotated_box_encode(anchor.to(NPU), gt.to(NPU), weight.to(NPU)).cpu()
    a, t = anchor[0, :, 0].tolist(), gt[0, :, 0].tolist()
    aw, ah, tw, th = a[2] - a[0], a[3] - a[1], t[2] - t[0], t[3] - t[1]
    expect = [10 * ((t[0] + t[2]) / 2 - (a[0] + a[2]) / 2) / aw, 10 * ((t[1] + t[3]) / 2 - (a[1] + a[3]) / 2) / ah,
              5 * math.log(tw / aw), 5 * math.log(th / ah), math.tan(math.radians(t[4])) - math.tan(math.radians(a[4]))]
    assert enc[0, :, 0].tolist() == pytest.approx(expect, rel=1e-9)
    dec = torch_npu.npu_rotated_box_decode(anchor.to(NPU), enc.to(NPU), weight.to(NPU))
    torch.testing.assert_close(dec.cpu(), gt)


def _polygon(box):
    """Corners of [cx, cy, w, h, angle degrees], counter-clockwise."""
    cx, cy, w, h, a = box
    c, s = math.cos(math.radians(a)), math.sin(math.radians(a))
    return [(cx + dx * c - dy * s, cy + dx * s + dy * c) for dx, dy in ((-w / 2, -h / 2), (w / 2, -h / 2),
                                                                        (w / 2, h / 2), (-w / 2, h / 2))]


def _clip(subject, clipper):
    """Sutherland-Hodgman: subject polygon clipped by a convex counter-clockwise clipper."""
    out = subject
    for k in range(len(clipper)):
        a, b = clipper[k], clipper[(k + 1) % len(clipper)]
        side = lambda p: (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])  # noqa: E731
        src, out = out, []
        for i in range(len(src)):
            p, q = src[i], src[(i + 1) % len(src)]
            sp, sq = side(p), side(q)
            if sp >= 0:
                out.append(p)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        if not out:
            return []
    return out


def _poly_area(p):
    return abs(sum(p[i][0] * p[(i + 1) % len(p)][1] - p[(i + 1) % len(p)][0] * p[i][1] for i in range(len(p)))) / 2


def _rot_boxes(b, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.cat((torch.rand(b, n, 2, generator=g, dtype=torch.float64) * 6,
                      torch.rand(b, n, 2, generator=g, dtype=torch.float64) * 4 + 1,
                      torch.rand(b, n, 1, generator=g, dtype=torch.float64) * 180 - 90), -1)


@pytest.mark.parametrize("trans", [False, True])
def test_rotated_overlaps_and_iou_match_polygon_clipping(trans):
    a, q = _rot_boxes(2, 4, 7), _rot_boxes(2, 3, 8)
    inter = torch.zeros(2, 4, 3, dtype=torch.float64)
    for b in range(2):
        for i in range(4):
            for j in range(3):
                inter[b, i, j] = _poly_area(_clip(_polygon(a[b, i].tolist()), _polygon(q[b, j].tolist())) or [(0, 0)])
    to_in = (lambda t: torch.cat((t[..., :2] - t[..., 2:4] / 2, t[..., :2] + t[..., 2:4] / 2, t[..., 4:]), -1)) \
        if trans else (lambda t: t)
    out = torch_npu.npu_rotated_overlaps(to_in(a).to(NPU), to_in(q).to(NPU), trans=trans)
    torch.testing.assert_close(out.cpu(), inter)
    area_a, area_q = a[..., 2] * a[..., 3], q[..., 2] * q[..., 3]
    iou = torch_npu.npu_rotated_iou(to_in(a).to(NPU), to_in(q).to(NPU), trans=trans)
    torch.testing.assert_close(iou.cpu(), inter / (area_a[..., :, None] + area_q[..., None, :] - inter))
    iof = torch_npu.npu_rotated_iou(to_in(a).to(NPU), to_in(q).to(NPU), trans=trans, mode=1)
    torch.testing.assert_close(iof.cpu(), inter / area_q[..., None, :])
    pairs = torch_npu.npu_rotated_iou(to_in(a[:, :3]).to(NPU), to_in(q).to(NPU), trans=trans, is_cross=False)
    torch.testing.assert_close(pairs.cpu(), iou.cpu()[:, :3].diagonal(dim1=1, dim2=2))


def test_rotated_iou_hand_computed():
    square = torch.tensor([[[0.0, 0.0, 1.0, 1.0, 0.0]]])
    others = torch.tensor([[[0.0, 0.0, 1.0, 1.0, 45.0], [0.5, 0.0, 1.0, 1.0, 0.0], [3.0, 3.0, 1.0, 1.0, 10.0]]])
    overlap = 2 * (math.sqrt(2) - 1)  # a unit square and itself turned 45 degrees: an octagon
    out = torch_npu.npu_rotated_overlaps(square.to(NPU), others.to(NPU)).cpu()
    torch.testing.assert_close(out, torch.tensor([[[overlap, 0.5, 0.0]]]))
    iou = torch_npu.npu_rotated_iou(square.to(NPU), others.to(NPU)).cpu()
    torch.testing.assert_close(iou, torch.tensor([[[overlap / (2 - overlap), 1 / 3, 0.0]]]))


def test_nms_rotated():
    dets = _rot_boxes(1, 40, 9)[0] * torch.tensor([4.0, 4.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    scores = torch.rand(40, generator=torch.Generator().manual_seed(10), dtype=torch.float64)

    def riou(a, b):
        inter = _poly_area(_clip(_polygon(a), _polygon(b)) or [(0, 0)])
        return inter / (a[2] * a[3] + b[2] * b[3] - inter)

    for limit in (-1, 5):
        idx, num = torch_npu.npu_nms_rotated(dets.to(NPU), scores.to(NPU), 0.1, 0.2, limit)
        ref = _greedy(dets.tolist(), scores.tolist(), 0.1, 0.2, limit, iou=riou)
        assert idx.dtype == torch.int32 and idx.cpu().tolist() == ref and num.cpu().tolist() == [len(ref)]
    with pytest.raises(ValueError, match="mode 1"):
        torch_npu.npu_nms_rotated(dets.to(NPU), scores.to(NPU), 0.1, 0.0, -1, 1)


def test_nms_rotated_compile():
    def fn(boxes, scores, rot):
        idx, num = ops.npu_nms_v4(boxes, scores, 5, torch.tensor(0.5, device=boxes.device),
                                  torch.tensor(0.0, device=boxes.device), True)
        return idx, num, ops.npu_rotated_iou(rot, rot, False, 0, True, 0.0, 0.0)

    boxes, scores, rot = _random_boxes(20, 11), torch.rand(20), _rot_boxes(1, 3, 12)
    args = (boxes.to(NPU), scores.to(NPU), rot.to(NPU))
    for a, b in zip(torch.compile(fn, backend="aot_eager", fullgraph=True)(*args), fn(*args)):
        torch.testing.assert_close(a.cpu(), b.cpu())


@pytest.mark.timeout(300)
def test_nms_opcheck():
    boxes, scores = _random_boxes(20, 13).to(NPU), torch.rand(20).to(NPU)
    thr = (torch.tensor(0.5).to(NPU), torch.tensor(0.1).to(NPU))
    for pad in (True, False):  # fixed, then data-dependent output length
        torch.library.opcheck(ops.npu_nms_v4, (boxes, scores, 6, *thr, pad), test_utils=OPCHECK)
    rot = torch.cat((boxes, torch.rand(20, 1, device=NPU) * 90), 1)
    torch.library.opcheck(ops.npu_nms_rotated, (rot, scores, 0.3), test_utils=OPCHECK)
    rows = torch.cat((boxes, scores[:, None], torch.zeros(20, 3, device=NPU)), 1)
    torch.library.opcheck(ops.npu_nms_with_mask, (rows, 0.5), test_utils=OPCHECK)
    torch.library.opcheck(ops.npu_batch_nms, (boxes.view(2, 10, 1, 4), torch.rand(2, 10, 3).to(NPU), 0.2, 0.5, 2, 4),
                          test_utils=OPCHECK)
