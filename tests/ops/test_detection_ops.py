"""torch_npu's box-overlap, box-coding, anchor-assignment and RoI pooling operators against references written
here from its documentation: the documented examples, and per-box loops of the documented formulas."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf


def _boxes(n, seed, scale=10.0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * scale
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * scale / 2 + 0.5
    return torch.cat((xy, xy + wh), 1)


def _area(b):
    return (b[2] - b[0]) * (b[3] - b[1])


def _inter(a, b):
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


# ---- IoU / PtIoU ----------------------------------------------------------------------------------------------
def test_iou_documented_example():
    b = torch.tensor([[0, 0, 10, 10], [10, 10, 20, 20], [32, 32, 38, 42]], dtype=torch.float16)
    g = torch.tensor([[0, 0, 10, 20], [0, 10, 10, 10], [10, 10, 20, 20]], dtype=torch.float16)
    out = torch_npu.npu_iou(b.to(NPU), g.to(NPU), 0)
    expect = torch.tensor([[0.4985, 0, 0], [0, 0, 0], [0, 0.9961, 0]])
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().float(), expect, atol=4e-3, rtol=0)


@pytest.mark.parametrize("name,mode", [("npu_iou", 0), ("npu_iou", 1), ("npu_ptiou", 0), ("npu_ptiou", 1)])
def test_iou_ptiou_formulas(name, mode):
    b, g = _boxes(5, 1), _boxes(3, 2)
    out = getattr(torch_npu, name)(b.to(NPU), g.to(NPU), mode).cpu()
    num_eps = 0.001 if name == "npu_iou" else 0.0
    for m in range(3):
        for n in range(5):
            bl, gl = b[n].tolist(), g[m].tolist()
            inter = _inter(bl, gl)
            denom = _area(bl) + _area(gl) - inter if mode == 0 else _area(gl)
            assert math.isclose(out[m, n].item(), (inter + num_eps) / (denom + 0.001), rel_tol=1e-9)


# ---- GIoU / DIoU / CIoU ------------------------------------------------------------------------------------------
def _ref_metric(kind, b, g, mode):
    """One pair of xyxy boxes (0-D tensor rows, so autograd runs through the reference too)."""
    iw = (torch.minimum(b[2], g[2]) - torch.maximum(b[0], g[0])).clamp(min=0)
    ih = (torch.minimum(b[3], g[3]) - torch.maximum(b[1], g[1])).clamp(min=0)
    inter = iw * ih
    ab, ag = (b[2] - b[0]) * (b[3] - b[1]), (g[2] - g[0]) * (g[3] - g[1])
    union = ab + ag - inter
    iou = inter / (union if mode == 0 else ag)
    cw = torch.maximum(b[2], g[2]) - torch.minimum(b[0], g[0])
    ch = torch.maximum(b[3], g[3]) - torch.minimum(b[1], g[1])
    if kind == "giou":
        return iou - (cw * ch - union) / (cw * ch)
    rho2 = ((b[0] + b[2]) / 2 - (g[0] + g[2]) / 2) ** 2 + ((b[1] + b[3]) / 2 - (g[1] + g[3]) / 2) ** 2
    diou = iou - rho2 / (cw ** 2 + ch ** 2)
    if kind == "diou":
        return diou
    v = 4 / math.pi ** 2 * (torch.atan((g[2] - g[0]) / (g[3] - g[1])) - torch.atan((b[2] - b[0]) / (b[3] - b[1]))) ** 2
    with torch.no_grad():
        alpha = v / (1 - iou + v)
    return diou - alpha * v


def _to_xyxy_cols(cols, trans):
    if not trans:
        return cols
    cx, cy, w, h = cols
    return torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))


@pytest.mark.parametrize("kind", ["giou", "diou", "ciou"])
@pytest.mark.parametrize("trans,is_cross,mode", [(True, False, 0), (False, False, 0), (False, True, 0),
                                                  (True, True, 1)])
def test_giou_diou_ciou(kind, trans, is_cross, mode):
    n, m = 4, (3 if is_cross else 4)
    b, g = _boxes(n, 3).t().contiguous(), _boxes(m, 4).t().contiguous()   # (4, n) columns
    if trans:  # the same boxes as [cx, cy, w, h]
        b = torch.stack(((b[0] + b[2]) / 2, (b[1] + b[3]) / 2, b[2] - b[0], b[3] - b[1]))
        g = torch.stack(((g[0] + g[2]) / 2, (g[1] + g[3]) / 2, g[2] - g[0], g[3] - g[1]))
    bn, gn, br, gr = leaf(b), leaf(g), ref_leaf(b), ref_leaf(g)
    out = getattr(torch_npu, "npu_" + kind)(bn, gn, trans, is_cross, mode)
    bx, gx = _to_xyxy_cols(br, trans), _to_xyxy_cols(gr, trans)
    if is_cross:
        ref = torch.stack([torch.stack([_ref_metric(kind, bx[:, j], gx[:, i], mode) for j in range(n)])
                           for i in range(m)])
    else:
        ref = torch.stack([_ref_metric(kind, bx[:, j], gx[:, j], mode) for j in range(n)])
        ref = ref.unsqueeze(-1) if kind == "giou" else ref.unsqueeze(0)  # GIoU (n, 1), DIoU/CIoU (1, n)
    assert out.shape == ref.shape
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    gout = torch.randn(ref.shape, dtype=ref.dtype)
    for a, r in zip(torch.autograd.grad(out, (bn, gn), gout.to(NPU)), torch.autograd.grad(ref, (br, gr), gout)):
        torch.testing.assert_close(a.cpu(), r)


def test_giou_documented_example_identical_boxes_give_one():
    a = torch.rand(4, 10).half()
    out = torch_npu.npu_giou(a.to(NPU), a.to(NPU), trans=True, is_cross=False, mode=0)
    assert out.shape == (10, 1) and out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().float(), torch.ones(10, 1), atol=2e-3, rtol=0)


# ---- box coders --------------------------------------------------------------------------------------------
def test_bounding_box_encode_decode_documented_examples():
    anchor = torch.tensor([[1., 2., 3., 4.], [3., 4., 5., 6.]])
    gt = torch.tensor([[5., 6., 7., 8.], [7., 8., 9., 6.]])
    enc = torch_npu.npu_bounding_box_encode(anchor.to(NPU), gt.to(NPU), 0, 0, 0, 0, 0.1, 0.1, 0.2, 0.2)
    torch.testing.assert_close(enc.cpu(), torch.tensor([[13.3281, 13.3281, 0.0, 0.0], [13.3281, 6.6641, 0.0, -5.4922]]),
                               atol=1e-2, rtol=0)
    dec = torch_npu.npu_bounding_box_decode(anchor.to(NPU), gt.to(NPU), 0, 0, 0, 0, 1, 1, 1, 1, (10, 10), 0.1)
    torch.testing.assert_close(dec.cpu(), torch.tensor([[2.5, 6.5, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]]))


def test_bounding_box_encode_then_decode_recovers_the_boxes():
    anchors, gts = _boxes(6, 5, 50.0), _boxes(6, 6, 50.0)
    means, stds = (0.1, -0.2, 0.05, 0.0), (0.1, 0.1, 0.2, 0.3)
    enc = torch_npu.npu_bounding_box_encode(anchors.to(NPU), gts.to(NPU), *means, *stds)
    for i in range(6):  # Faster R-CNN's +1 extent, per box
        pw, ph = anchors[i, 2] - anchors[i, 0] + 1, anchors[i, 3] - anchors[i, 1] + 1
        gw, gh = gts[i, 2] - gts[i, 0] + 1, gts[i, 3] - gts[i, 1] + 1
        px, py = anchors[i, 0] + (pw - 1) / 2, anchors[i, 1] + (ph - 1) / 2
        gx, gy = gts[i, 0] + (gw - 1) / 2, gts[i, 1] + (gh - 1) / 2
        d = [(gx - px) / pw, (gy - py) / ph, math.log(gw / pw), math.log(gh / ph)]
        for k in range(4):
            assert math.isclose(enc[i, k].item(), (d[k] - means[k]) / stds[k], rel_tol=1e-9, abs_tol=1e-9)
    dec = torch_npu.npu_bounding_box_decode(anchors.to(NPU), enc, *means, *stds, (1000, 1000), 1e-4)
    torch.testing.assert_close(dec.cpu(), gts)


def test_yolo_boxes_encode():
    b, g = _boxes(5, 7, 40.0), _boxes(5, 8, 40.0)
    stride = torch.tensor([8., 16., 32., 8., 16.], dtype=torch.float64)
    out = torch_npu.npu_yolo_boxes_encode(b.to(NPU), g.to(NPU), stride.to(NPU)).cpu()
    for i in range(5):
        bw, bh, gw, gh = b[i, 2] - b[i, 0], b[i, 3] - b[i, 1], g[i, 2] - g[i, 0], g[i, 3] - g[i, 1]
        tx = min(max(((g[i, 0] + g[i, 2]) / 2 - (b[i, 0] + b[i, 2]) / 2) / stride[i] + 0.5, 1e-6), 1 - 1e-6)
        ty = min(max(((g[i, 1] + g[i, 3]) / 2 - (b[i, 1] + b[i, 3]) / 2) / stride[i] + 0.5, 1e-6), 1 - 1e-6)
        ref = [tx, ty, math.log(max(gw / bw, 1e-6)), math.log(max(gh / bh, 1e-6))]
        assert out[i].tolist() == pytest.approx([float(v) for v in ref], rel=1e-9, abs=1e-12)


# ---- anchor flags, grid assignment ------------------------------------------------------------------------------
def test_anchor_response_flags():
    gt = torch.tensor([[0., 0., 3., 3.], [10., 2., 14., 6.], [100., 100., 104., 104.]])  # the last is off the grid
    out = torch_npu.npu_anchor_response_flags(gt.to(NPU), [4, 8], [2, 2], 3)
    assert out.dtype == torch.uint8 and out.shape == (4 * 8 * 3,)
    cells = torch.zeros(4 * 8, dtype=torch.uint8)
    cells[0 * 8 + 0] = 1  # centre (1.5, 1.5) -> cell (x 0, y 0)
    cells[2 * 8 + 6] = 1  # centre (12, 4) -> cell (x 6, y 2)
    assert out.cpu().tolist() == [int(c) for c in cells for _ in range(3)]
    assert torch_npu.npu_anchor_response_flags(torch.rand(100, 4).to(NPU), [60, 60], [2, 2], 9).shape == (32400,)


@pytest.mark.parametrize("assign_all", [True, False])
def test_grid_assign_positive_follows_the_grid_assigner(assign_all):
    torch.manual_seed(9)
    k, n = 3, 8
    overlaps = torch.rand(k, n)
    overlaps[1, 5] = overlaps[1].max() + 0.5
    overlaps[1, 2] = overlaps[1, 5]  # a tie for gt 1's best box
    flags = torch.tensor([1, 1, 1, 0, 1, 1, 0, 1], dtype=torch.uint8)
    max_ov, argmax_ov = overlaps.max(0)
    gt_max, gt_argmax = overlaps.max(1)
    assigned = torch.zeros(n)
    out = torch_npu.npu_grid_assign_positive(assigned.to(NPU), overlaps.to(NPU), flags.to(NPU), max_ov.to(NPU),
                                             argmax_ov.int().to(NPU), gt_max.to(NPU), gt_argmax.int().to(NPU), 128,
                                             0.5, 0.1, assign_all)
    ref = assigned.clone()  # mmdetection's GridAssigner, steps 3 and 4, literally
    pos = (max_ov > 0.5) & flags.bool()
    ref[pos] = argmax_ov[pos].float() + 1
    for i in range(k):
        if gt_max[i] > 0.1:
            if assign_all:
                hit = (overlaps[i] == gt_max[i]) & flags.bool()
                ref[hit] = i + 1
            elif flags[gt_argmax[i]]:
                ref[gt_argmax[i]] = i + 1
    assert out.cpu().tolist() == ref.tolist()


# ---- RoI align, position-sensitive RoI pooling ----------------------------------------------------------------
def test_roi_align_documented_example():
    x = torch.arange(1.0, 37.0).view(1, 1, 6, 6)
    out = torch_npu.npu_roi_align(x.to(NPU), torch.tensor([[0, -2.0, -2.0, 22.0, 22.0]]).to(NPU), 0.25, 3, 3, 2, 0)
    assert out.cpu().tolist() == [[[[4.5, 6.5, 8.5], [16.5, 18.5, 20.5], [28.5, 30.5, 32.5]]]]


def _bilinear(f, y, x):
    """One channel map f (H, W) at (y, x): Mask R-CNN's bilinear sample (0 beyond one pixel outside)."""
    h, w = f.shape
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return f.new_zeros(())
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = min(int(math.floor(y)), h - 1), min(int(math.floor(x)), w - 1)
    y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
    y, x = (float(y0) if y0 >= h - 1 else y), (float(x0) if x0 >= w - 1 else x)
    ly, lx = y - y0, x - x0
    return (1 - ly) * (1 - lx) * f[y0, x0] + (1 - ly) * lx * f[y0, x1] + ly * (1 - lx) * f[y1, x0] + ly * lx * f[y1, x1]


def _ref_roi_align(feat, rois, scale, ph, pw, sample, end_mode):
    out = []
    for r in rois.tolist():
        b, x0, y0, x1, y1 = r
        e = 1.0 if end_mode else 0.0
        sx, sy = x0 * scale, y0 * scale
        rw, rh = max((x1 + e) * scale - sx, 1.0), max((y1 + e) * scale - sy, 1.0)
        bh, bw = rh / ph, rw / pw
        gy = sample or math.ceil(bh)
        gx = sample or math.ceil(bw)
        chans = []
        for c in range(feat.shape[1]):
            rows = []
            for i in range(ph):
                cols = []
                for j in range(pw):
                    acc = sum(_bilinear(feat[int(b), c], sy + i * bh + (u + 0.5) * bh / gy,
                                        sx + j * bw + (v + 0.5) * bw / gx) for u in range(gy) for v in range(gx))
                    cols.append(acc / (gy * gx))
                rows.append(torch.stack(cols))
            chans.append(torch.stack(rows))
        out.append(torch.stack(chans))
    return torch.stack(out)


@pytest.mark.parametrize("sample,end_mode", [(2, 1), (0, 0), (1, 1)])
def test_roi_align_matches_bilinear_sampling(sample, end_mode):
    feat = torch.randn(2, 2, 7, 6, dtype=torch.float64)
    rois = torch.tensor([[0, 1.0, 2.0, 17.0, 21.0], [1, -3.0, 0.5, 10.0, 6.0], [1, 20.0, 20.0, 30.0, 31.0]],
                        dtype=torch.float64)
    fn, fr = leaf(feat), ref_leaf(feat)
    out = torch_npu.npu_roi_align(fn, rois.to(NPU), 0.5, 2, 3, sample, end_mode)
    ref = _ref_roi_align(fr, rois, 0.5, 2, 3, sample, end_mode)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    g = torch.randn(ref.shape, dtype=ref.dtype)
    torch.testing.assert_close(torch.autograd.grad(out, fn, g.to(NPU))[0].cpu(), torch.autograd.grad(ref, fr, g)[0])


def test_ps_roi_pooling():
    g, d = 2, 3
    x = torch.randn(2, d * g * g, 6, 7, dtype=torch.float64)
    rois = torch.tensor([[[0, 1], [1.2, 0.0], [0.6, 2.0], [9.0, 6.0], [8.1, 11.0]],
                         [[1, 5], [4.0, 0.0], [2.0, 0.0], [4.0, 1.0], [2.0, 1.0]]], dtype=torch.float64)  # (2, 5, 2)
    xn, xr = leaf(x), ref_leaf(x)
    out = torch_npu.npu_ps_roi_pooling(xn, rois.to(NPU), 0.5, g, d)
    refs = []
    for bi in range(2):
        for ri in range(2):
            b, x1, y1, x2, y2 = rois[bi, :, ri].tolist()
            sx, sy = round(x1) * 0.5, round(y1) * 0.5
            bw, bh = max((round(x2) + 1) * 0.5 - sx, 0.1) / g, max((round(y2) + 1) * 0.5 - sy, 0.1) / g
            cell = []
            for c in range(d):
                for i in range(g):
                    for j in range(g):
                        hs, he = min(max(math.floor(i * bh + sy), 0), 6), min(max(math.ceil((i + 1) * bh + sy), 0), 6)
                        ws, we = min(max(math.floor(j * bw + sx), 0), 7), min(max(math.ceil((j + 1) * bw + sx), 0), 7)
                        if he <= hs or we <= ws or not 0 <= b < 2:
                            cell.append(xr.new_zeros(()))
                        else:
                            cell.append(xr[int(b), (c * g + i) * g + j, hs:he, ws:we].mean())
            refs.append(torch.stack(cell).view(d, g, g))
    ref = torch.stack(refs)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    gr = torch.randn(ref.shape, dtype=ref.dtype)
    torch.testing.assert_close(torch.autograd.grad(out, xn, gr.to(NPU))[0].cpu(), torch.autograd.grad(ref, xr, gr)[0])
    zero = torch_npu.npu_ps_roi_pooling(  # the documented example: RoIs off the 1 x 1 map, batch id 6 absent
        torch.arange(1.0, 17.0).view(2, 8, 1, 1).half().to(NPU),
        torch.tensor([[[1], [2], [3], [4], [5]], [[6], [7], [8], [9], [10]]], dtype=torch.float16).to(NPU), 0.5, 2, 2)
    assert zero.shape == (2, 2, 2, 2) and not zero.cpu().any()


def test_detection_compile():
    def fn(b, g, feat, rois):
        return (ops.npu_giou(b, g, True, False, 0).sum() + ops.npu_ciou(b, g, True, False, 0, False).sum()
                + ops.npu_roi_align(feat, rois, 0.5, 2, 2, 2, 1).sum()
                + ops.npu_iou(b.t(), g.t(), 0).sum())

    b = torch.tensor([[2., 3., 4.], [2., 3., 1.], [1., 2., 2.], [2., 1., 3.]], dtype=torch.float64)
    g = b + 0.3
    feat, rois = torch.randn(1, 2, 5, 5, dtype=torch.float64), torch.tensor([[0, 0.5, 1.0, 6.0, 7.0]]).double()
    be = leaf(b)
    ge = torch.autograd.grad(fn(be, g.to(NPU), feat.to(NPU), rois.to(NPU)), be)[0]
    bc = leaf(b)
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(bc, g.to(NPU), feat.to(NPU), rois.to(NPU))
    torch.testing.assert_close(torch.autograd.grad(out, bc)[0].cpu(), ge.cpu())
