"""torch_npu.contrib's model-zoo helpers against references written from their documentation (loops and plain
torch on cpu), on npu tensors."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401  (the package under test)
from torch_npu.contrib import (ChannelShuffle, Focus, LabelSmoothingCrossEntropy, NpuDropPath, Prefetcher, PSROIPool,
                               fuse_add_softmax_dropout, matmul_transpose, npu_batched_multiclass_nms,
                               npu_bbox_coder_decode_xywh2xyxy, npu_bbox_coder_encode_xyxy2xywh,
                               npu_bbox_coder_encode_yolo, npu_fast_condition_index_put, npu_multiclass_nms,
                               npu_single_level_responsible_flags, roll, ROIAlign)

from ._common import NPU, leaf, ref_leaf


def _iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _multiclass_nms_reference(boxes, scores, score_thr, nms_thr, max_num):
    """mmdetection's contract: background column dropped, per-class greedy NMS, best first, zero-padded."""
    picked = []
    for c in range(len(scores[0]) - 1):
        order = sorted((i for i in range(len(boxes)) if scores[i][c] > score_thr), key=lambda i: -scores[i][c])
        kept = []
        for i in order:
            if all(_iou(boxes[i], boxes[j]) <= nms_thr for j in kept):
                kept.append(i)
        picked += [(scores[i][c], c, i) for i in kept]
    picked.sort(key=lambda p: -p[0])
    picked = picked[:max_num]
    dets = torch.zeros(max_num, 5)
    labels = torch.zeros(max_num)
    for k, (s, c, i) in enumerate(picked):
        dets[k] = torch.tensor(list(boxes[i]) + [s])
        labels[k] = c
    return dets, labels


BOXES = [[0., 0., 10., 10.], [1., 1., 11., 11.], [20., 20., 30., 30.], [40., 0., 50., 8.]]
SCORES = [[0.9, 0.1, 0.5], [0.8, 0.6, 0.5], [0.3, 0.7, 0.5], [0.02, 0.4, 0.9]]   # last column: background


def test_multiclass_nms_keeps_per_class_survivors_best_first():
    dets, labels = npu_multiclass_nms(torch.tensor(BOXES, device=NPU), torch.tensor(SCORES, device=NPU),
                                      score_thr=0.05, nms_thr=0.45, max_num=8)
    ref_dets, ref_labels = _multiclass_nms_reference(BOXES, SCORES, 0.05, 0.45, 8)
    assert dets.shape == (8, 5) and labels.shape == (8,)
    torch.testing.assert_close(dets.cpu(), ref_dets)
    torch.testing.assert_close(labels.cpu().float(), ref_labels)
    # score_factors multiply every class's score before the threshold
    factors = torch.tensor([1.0, 1.0, 0.1, 1.0])
    dets_f, _ = npu_multiclass_nms(torch.tensor(BOXES, device=NPU), torch.tensor(SCORES, device=NPU), 0.05, 0.45, 8,
                                   score_factors=factors.to(NPU))
    scaled = [[s * f for s in row] for row, f in zip(SCORES, factors.tolist())]
    torch.testing.assert_close(dets_f.cpu(), _multiclass_nms_reference(BOXES, scaled, 0.05, 0.45, 8)[0])


def test_batched_multiclass_nms_treats_each_image_on_its_own():
    other = [[0.1, 0.9, 0.0], [0.95, 0.2, 0.0], [0.5, 0.5, 0.0], [0.6, 0.01, 0.0]]
    dets, labels = npu_batched_multiclass_nms(torch.tensor([BOXES, BOXES], device=NPU),
                                              torch.tensor([SCORES, other], device=NPU), 0.05, 0.45, 3)
    for b, scores in enumerate((SCORES, other)):
        ref_dets, ref_labels = _multiclass_nms_reference(BOXES, scores, 0.05, 0.45, 3)
        torch.testing.assert_close(dets[b].cpu(), ref_dets)
        torch.testing.assert_close(labels[b].cpu().float(), ref_labels)
    with pytest.raises(ValueError, match="npu_batched_multiclass_nms: multi_scores"):
        npu_batched_multiclass_nms(torch.zeros(4, 4, device=NPU), torch.zeros(4, 3, device=NPU))


def test_single_level_responsible_flags_mark_the_cells_of_box_centres():
    featmap, stride, anchors = (4, 5), (8, 8), 3
    gt = torch.tensor([[3., 3., 9., 13.], [30., 20., 38., 28.]])
    flags = npu_single_level_responsible_flags(featmap, gt.to(NPU), stride, anchors).cpu()
    ref = torch.zeros(featmap[0] * featmap[1] * anchors, dtype=torch.uint8)
    for x1, y1, x2, y2 in gt.tolist():
        cx, cy = int((x1 + x2) / 2 // stride[0]), int((y1 + y2) / 2 // stride[1])
        ref[(cy * featmap[1] + cx) * anchors:(cy * featmap[1] + cx + 1) * anchors] = 1
    assert torch.equal(flags.to(torch.uint8), ref)


def test_bbox_coder_encode_yolo_is_mmdetections_yolo_encoding():
    anchors = torch.tensor([[0., 0., 16., 16.], [8., 8., 40., 24.]])
    gt = torch.tensor([[2., 3., 14., 18.], [10., 6., 36., 30.]])
    stride = torch.tensor([16, 32], dtype=torch.int32)
    out = npu_bbox_coder_encode_yolo(anchors.to(NPU), gt.to(NPU), stride.to(NPU)).cpu()
    eps = 1e-6
    ref = []
    for a, g, s in zip(anchors.tolist(), gt.tolist(), stride.tolist()):
        acx, acy, aw, ah = (a[0] + a[2]) / 2, (a[1] + a[3]) / 2, a[2] - a[0], a[3] - a[1]
        gcx, gcy, gw, gh = (g[0] + g[2]) / 2, (g[1] + g[3]) / 2, g[2] - g[0], g[3] - g[1]
        ref.append([min(max((gcx - acx) / s + 0.5, eps), 1 - eps), min(max((gcy - acy) / s + 0.5, eps), 1 - eps),
                    math.log(max(gw / aw, eps)), math.log(max(gh / ah, eps))])
    torch.testing.assert_close(out, torch.tensor(ref), rtol=1e-5, atol=1e-5)


def test_bbox_coder_encode_and_decode_are_the_legacy_delta_coder():
    anchors = torch.tensor([[0., 0., 15., 15.], [8., 8., 39., 23.], [5., 2., 9., 30.]])
    gt = torch.tensor([[2., 3., 14., 18.], [10., 6., 36., 30.], [4., 4., 12., 20.]])
    means, stds = [0.1, -0.1, 0.0, 0.2], [0.1, 0.1, 0.2, 0.2]
    scale = 100.0
    deltas = npu_bbox_coder_encode_xyxy2xywh((anchors / scale).to(NPU), (gt / scale).to(NPU), means, stds,
                                             is_normalized=True, normalized_scale=scale).cpu()
    ref = []
    for a, g in zip(anchors.tolist(), gt.tolist()):   # Faster R-CNN's deltas, boxes one pixel wider than x2 - x1
        pw, ph, gw, gh = a[2] - a[0] + 1, a[3] - a[1] + 1, g[2] - g[0] + 1, g[3] - g[1] + 1
        d = [((g[0] + g[2]) - (a[0] + a[2])) / 2 / pw, ((g[1] + g[3]) - (a[1] + a[3])) / 2 / ph,
             math.log(gw / pw), math.log(gh / ph)]
        ref.append([(v - m) / s for v, m, s in zip(d, means, stds)])
    torch.testing.assert_close(deltas, torch.tensor(ref), rtol=1e-4, atol=1e-4)
    # decoding the deltas with the same means and stds gives the ground truth back
    back = npu_bbox_coder_decode_xywh2xyxy(anchors.to(NPU), deltas.to(NPU), means, stds, max_shape=(1000, 1000))
    torch.testing.assert_close(back.cpu(), gt, rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="means needs 4 values"):
        npu_bbox_coder_encode_xyxy2xywh(anchors.to(NPU), gt.to(NPU), means=[0.0])


def test_fast_condition_index_put():
    x = torch.randn(5, 6)
    cond = x > 0.3
    ref = x.clone()
    ref[cond] = 2.5
    assert torch.equal(npu_fast_condition_index_put(x.to(NPU), cond.to(NPU), 2.5).cpu(), ref)
    with pytest.raises(TypeError, match="condition must be a bool tensor"):
        npu_fast_condition_index_put(x.to(NPU), cond.int().to(NPU), 1)


def test_roll_is_torch_roll_with_its_gradient():
    x = torch.randn(2, 5, 6, 3)
    y = leaf(x)
    out = roll(y, (2, -3), (1, 2))
    assert torch.equal(out.detach().cpu(), torch.roll(x, (2, -3), (1, 2)))
    g = torch.randn_like(x)
    out.backward(g.to(NPU))
    assert torch.equal(y.grad.cpu(), torch.roll(g, (-2, 3), (1, 2)))
    with pytest.raises(ValueError, match="roll: needs two shifts"):
        roll(y, (1,), (1,))


def test_matmul_transpose_and_its_gradients():
    a, b = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4)
    na, nb = leaf(a), leaf(b)
    ra, rb = ref_leaf(a), ref_leaf(b)
    out = matmul_transpose(na, nb)
    ref = ra @ rb.transpose(-2, -1)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    g = torch.randn_like(ref)
    out.backward(g.to(NPU))
    ref.backward(g)
    torch.testing.assert_close(na.grad.cpu(), ra.grad)
    torch.testing.assert_close(nb.grad.cpu(), rb.grad)


def test_fuse_add_softmax_dropout():
    scores, mask = torch.randn(2, 4, 8, 8), torch.randn(2, 1, 8, 8)
    ref = torch.softmax(mask + scores / math.sqrt(16.0), dim=-1)
    drop = torch.nn.Dropout(0.5)
    out = fuse_add_softmax_dropout(False, drop, mask.to(NPU), scores.to(NPU), 16.0)
    torch.testing.assert_close(out.cpu(), ref)
    # training: every probability is dropped or scaled by 1 / (1 - p)
    trained = fuse_add_softmax_dropout(True, drop, mask.to(NPU), scores.to(NPU), 16.0).cpu()
    kept = trained != 0
    assert 0 < kept.float().mean() < 1
    torch.testing.assert_close(trained[kept], ref[kept] * 2)


def test_channel_shuffle_interleaves_the_groups():
    x1, x2 = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    x = torch.cat([x1, x2], 1)
    ref = torch.empty_like(x)
    for i in range(2):             # group i, channel j of the group -> output channel j * groups + i
        for j in range(4):
            ref[:, j * 2 + i] = x[:, i * 4 + j]
    shuffle = ChannelShuffle(8, groups=2, split_shuffle=True)
    a, b = shuffle(x1.to(NPU), x2.to(NPU))
    assert torch.equal(torch.cat([a, b], 1).cpu(), ref)
    full = ChannelShuffle(8, groups=2, split_shuffle=False)(x1.to(NPU), x2.to(NPU))
    assert torch.equal(full.cpu(), ref)
    with pytest.raises(ValueError, match="multiple of groups"):
        ChannelShuffle(9, groups=2)


def test_focus_is_space_to_depth_then_conv_bn_leaky_relu():
    torch.manual_seed(0)
    focus = Focus(3, 8, k=3).eval()
    x = torch.randn(2, 3, 8, 8)
    ref_in = torch.empty(2, 12, 4, 4)
    for n, (dy, dx) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        ref_in[:, n * 3:(n + 1) * 3] = x[:, :, dy::2, dx::2]
    c = focus.conv
    ref = F.leaky_relu(F.batch_norm(F.conv2d(ref_in, c.conv.weight, padding=1), c.bn.running_mean,
                                    c.bn.running_var, c.bn.weight, c.bn.bias, False, 0.0, c.bn.eps), 0.1)
    out = focus.to(NPU)(x.to(NPU))
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    assert set(focus.state_dict()) >= {"conv.conv.weight", "conv.bn.weight", "conv.bn.running_mean"}


def test_label_smoothing_cross_entropy():
    pred, target = torch.randn(6, 5), torch.tensor([0, 4, 2, 2, 1, 3])
    loss = LabelSmoothingCrossEntropy(num_classes=5, smooth_factor=0.2)(leaf(pred), target.to(NPU))
    logp = torch.log_softmax(pred, 1)
    ref = sum(-(0.8 * logp[i, t] + sum(0.05 * logp[i, c] for c in range(5) if c != t))
              for i, t in enumerate(target.tolist())) / 6
    torch.testing.assert_close(loss.detach().cpu(), ref)
    plain = LabelSmoothingCrossEntropy(num_classes=5)(pred.to(NPU), target.to(NPU))
    torch.testing.assert_close(plain.cpu(), F.cross_entropy(pred, target))


def test_ps_roi_pool_module():
    feats = torch.randn(1, 2 * 3 * 3, 12, 12)
    rois = torch.tensor([[[0.], [8.], [8.], [40.], [40.]]])        # (B, 5, R), image coordinates
    module = PSROIPool(3, 3, 1 / 4.0, 3, 2)
    out = module(feats.to(NPU), rois.to(NPU))
    ref = torch_npu.npu_ps_roi_pooling(feats.to(NPU), rois.to(NPU), 1 / 4.0, 3, 2)
    assert out.shape == (1, 2, 3, 3) and torch.equal(out.cpu(), ref.cpu())
    assert "pooled_width=3" in repr(module)
    with pytest.raises(ValueError, match="pooled_height == pooled_width == group_size"):
        PSROIPool(7, 5, 1 / 16.0, 7, 22)


def test_drop_path_drops_whole_samples_and_draws_ahead_when_enabled():
    torch.manual_seed(0)
    x = torch.randn(64, 3, 4)
    dp = NpuDropPath(0.25)
    assert dp.eval()(x.to(NPU)) is not None and torch.equal(dp(x.to(NPU)).cpu(), x)
    dp.train()

    def check(out):
        for n in range(x.shape[0]):
            if out[n].abs().sum() != 0:
                torch.testing.assert_close(out[n], x[n] / 0.75)
        dropped = (out.flatten(1).abs().sum(1) == 0).float().mean()
        assert 0 < dropped < 0.6

    check(dp(x.to(NPU)).cpu())
    model = torch.nn.Sequential(dp)
    NpuDropPath.enable_droppath_ensemble(model)
    for _ in range(3):          # from the second forward on the draw comes from the side stream
        check(model(x.to(NPU)).cpu())
    key = ((64, 3, 4), x.to(NPU).device, torch.float32)
    assert NpuDropPath._requests[key] >= 1 and NpuDropPath._ready[key] == []


def test_prefetcher_yields_the_loaders_batches_on_npu():
    batches = [(torch.randn(4, 3).pin_memory(), torch.arange(4).pin_memory()) for _ in range(3)]
    fetch = Prefetcher(batches)
    for inp, target in batches:
        got_inp, got_target = fetch.next()
        assert got_inp.device.type == "npu" and torch.equal(got_inp.cpu(), inp)
        assert torch.equal(got_target.cpu(), target)
    assert fetch.next() == (None, None)


def _bilinear(f, y, x):
    """torchvision's roi_align sampling of one (C, H, W) map at (y, x)."""
    h, w = f.shape[1:]
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return torch.zeros(f.shape[0], dtype=f.dtype)
    y, x = max(y, 0.0), max(x, 0.0)
    yl, xl = int(y), int(x)
    if yl >= h - 1:
        yl = yh = h - 1
        y = float(yl)
    else:
        yh = yl + 1
    if xl >= w - 1:
        xl = xh = w - 1
        x = float(xl)
    else:
        xh = xl + 1
    ly, lx = y - yl, x - xl
    return ((1 - ly) * (1 - lx) * f[:, yl, xl] + (1 - ly) * lx * f[:, yl, xh] + ly * (1 - lx) * f[:, yh, xl]
            + ly * lx * f[:, yh, xh])


def _roi_align_reference(feat, rois, scale, ph, pw, ratio, aligned):
    out = []
    for b, x1, y1, x2, y2 in rois.tolist():
        off = 0.5 if aligned else 0.0
        sx, sy = x1 * scale - off, y1 * scale - off
        rw, rh = x2 * scale - off - sx, y2 * scale - off - sy
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        gh = ratio if ratio > 0 else math.ceil(rh / ph)
        gw = ratio if ratio > 0 else math.ceil(rw / pw)
        bins = []
        for i in range(ph):
            for j in range(pw):
                acc = torch.zeros(feat.shape[1], dtype=feat.dtype)
                for iy in range(max(gh, 0)):
                    for ix in range(max(gw, 0)):
                        acc = acc + _bilinear(feat[int(b)], sy + i * bh + (iy + 0.5) * bh / gh,
                                              sx + j * bw + (ix + 0.5) * bw / gw)
                bins.append(acc / max(gh * gw, 1))
        out.append(torch.stack(bins, 1).reshape(feat.shape[1], ph, pw))
    return torch.stack(out)


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("ratio", [2, 0])
def test_roi_align_module_is_detectron2s_roi_align(aligned, ratio):
    torch.manual_seed(1)
    feat = torch.randn(2, 3, 7, 8)
    rois = torch.tensor([[0, 1.0, 2.0, 9.0, 11.0], [1, 0.0, 0.0, 15.0, 13.0], [0, 4.0, 4.0, 4.5, 5.0]])
    nf = leaf(feat)
    out = ROIAlign((2, 3), 0.5, ratio, aligned=aligned)(nf, rois.to(NPU))
    rf = ref_leaf(feat)
    ref = _roi_align_reference(rf, rois, 0.5, 2, 3, ratio, aligned)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    out.backward(g.to(NPU))
    ref.backward(g)
    torch.testing.assert_close(nf.grad.cpu(), rf.grad, rtol=1e-5, atol=1e-5)


def _int8(g, *shape):
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


def test_linear_quant_is_the_integer_product_scaled():
    from torch_npu.contrib import LinearA8W8Quant, LinearQuant

    g = torch.Generator().manual_seed(3)
    x, w = _int8(g, 3, 16), _int8(g, 5, 16)
    scale = torch.rand(5, generator=g) * 0.01
    bias = torch.randint(-1000, 1000, (5,), generator=g, dtype=torch.int32)
    acc = (x.long() @ w.long().T + bias.long()).double()            # exact, as the integer kernel accumulates
    layer = LinearQuant(16, 5, output_dtype=torch.float16)
    layer.weight.data, layer.scale.data, layer.bias.data = w, scale, bias
    out = layer.to(NPU)(x.to(NPU))
    torch.testing.assert_close(out.cpu(), (acc * scale.double()).half(), rtol=1e-3, atol=1e-3)
    # int8 output: the offset is added, then rounding half to even and saturation
    q = LinearQuant(16, 5, offset=True)
    q.weight.data, q.scale.data, q.bias.data = w, scale, bias
    q.offset.data = torch.full((5,), 3.0)
    want = torch.round(acc * scale.double() + 3.0).clamp(-128, 127).to(torch.int8)
    assert torch.equal(q.to(NPU)(x.to(NPU)).cpu(), want)
    with pytest.raises(ValueError, match="both be int8"):
        LinearQuant(16, 5)(x.to(NPU))                                 # weight still float: not loaded
    with pytest.warns(FutureWarning, match="deprecated"):
        old = LinearA8W8Quant(16, 5, output_dtype=torch.float16)
    old.weight.data, old.scale.data, old.bias.data = w, scale, bias
    torch.testing.assert_close(old.to(NPU)(x.to(NPU)).cpu(), out.cpu())
    old.scale.data = scale.half()
    with pytest.raises(ValueError, match="scale must be one of"):
        old(x.to(NPU))


def test_linear_weight_quant_dequantises_the_weight():
    from torch_npu.contrib import LinearWeightQuant

    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(3, 16, generator=g), _int8(g, 5, 16)
    scale, offset, bias = torch.rand(5, generator=g) * 0.1, torch.randn(5, generator=g), torch.randn(5, generator=g)
    layer = LinearWeightQuant(16, 5, antiquant_offset=True)
    layer.weight.data, layer.antiquant_scale.data = w, scale
    layer.antiquant_offset.data, layer.bias.data = offset, bias
    want = x.double() @ ((w.double().T + offset.double()) * scale.double()) + bias.double()
    torch.testing.assert_close(layer.to(NPU)(x.to(NPU)).cpu(), want.float(), rtol=1e-4, atol=1e-4)


def test_cached_dropout_drops_in_training_and_draws_ahead_when_enabled():
    from torch_npu.contrib import NpuCachedDropout, NpuFairseqDropout

    assert NpuFairseqDropout is NpuCachedDropout
    x = torch.randn(64, 32)
    drop = NpuCachedDropout(0.25, module_name="attn")
    assert torch.equal(drop.eval()(x.to(NPU)).cpu(), x)
    drop.train()

    def check(out):
        kept = out != 0
        torch.testing.assert_close(out[kept], x[kept] / 0.75)
        assert 0.6 < kept.float().mean() < 0.9

    check(drop(x.to(NPU)).cpu())
    model = torch.nn.Sequential(drop)
    NpuCachedDropout.enable_dropout_ensemble(model)
    outs = [model(x.to(NPU)).cpu() for _ in range(3)]   # from the second forward on the masks come ready-made
    for out in outs:
        check(out)
    assert not torch.equal(outs[1], outs[2])
    key = ((64, 32), torch.float32, x.to(NPU).device, 0.25)
    assert NpuCachedDropout._requests[key] >= 1 and len(NpuCachedDropout._ready[key]) == NpuCachedDropout._requests[key]
    mask = drop([(4, 4), torch.float32, "npu:0"])
    assert mask.dtype == torch.bool and mask.shape == (4, 4)
