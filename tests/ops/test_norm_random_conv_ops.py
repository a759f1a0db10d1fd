"""torch_npu's group-norm, batch-statistics, dropout, sampling, float-status and convolution operators against
references written here from its documentation."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf

OPCHECK = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def _check(out_n, out_r, ins_n, ins_r, seed=0, **tol):
    torch.testing.assert_close(out_n.detach().cpu(), out_r.detach(), **tol)
    g = torch.randn(out_r.shape, dtype=out_r.dtype, generator=torch.Generator().manual_seed(seed))
    gn = torch.autograd.grad(out_n, ins_n, g.to(NPU), retain_graph=True)
    gr = torch.autograd.grad(out_r, ins_r, g, retain_graph=True)
    for a, b in zip(gn, gr):
        torch.testing.assert_close(a.cpu(), b, **tol)


def _bits(mask, n):
    """Ascend's dropout bit mask read with numpy: bit j of byte i is element 8 i + j."""
    return torch.from_numpy(np.unpackbits(mask.cpu().numpy(), bitorder="little")[:n].astype(bool))


# ---- group norm + activation, batch statistics -------------------------------------------------------------------
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_silu(affine):
    x, w, b = torch.randn(2, 6, 3, 4, dtype=torch.float64), torch.randn(6).double(), torch.randn(6).double()
    xn, wn, bn, xr, wr, br = leaf(x), leaf(w), leaf(b), ref_leaf(x), ref_leaf(w), ref_leaf(b)
    out, mean, rstd = torch_npu.npu_group_norm_silu(xn, wn if affine else None, bn if affine else None, 3, 1e-5)
    ref = F.silu(F.group_norm(xr, 3, wr if affine else None, br if affine else None, 1e-5))
    grouped = x.reshape(2, 3, -1)
    torch.testing.assert_close(mean.cpu(), grouped.mean(-1))
    torch.testing.assert_close(rstd.cpu(), 1 / torch.sqrt(grouped.var(-1, unbiased=False) + 1e-5))
    _check(out, ref, (xn, wn, bn) if affine else (xn,), (xr, wr, br) if affine else (xr,))
    with pytest.raises(ValueError, match="divisible"):
        torch_npu.npu_group_norm_silu(xn, None, None, 4)


def test_group_norm_swish_and_half_input():
    x, w, b = torch.randn(3, 4, 6, dtype=torch.float64), torch.randn(4).double(), torch.randn(4).double()
    xn, wn, bn, xr, wr, br = leaf(x), leaf(w), leaf(b), ref_leaf(x), ref_leaf(w), ref_leaf(b)
    out, mean, rstd = torch_npu.npu_group_norm_swish(xn, 4, wn, bn, eps=1e-5, swish_scale=0.7)
    y = F.group_norm(xr, 4, wr, br, 1e-5)
    assert mean.shape == rstd.shape == (3, 4)
    _check(out, y * torch.sigmoid(0.7 * y), (xn, wn, bn), (xr, wr, br))
    h = torch.randn(2, 4, 5).half()
    out, mean, _ = torch_npu.npu_group_norm_swish(h.to(NPU), 2, torch.ones(4).half().to(NPU),
                                                  torch.zeros(4).half().to(NPU))
    y = F.group_norm(h.float(), 2, eps=1e-5)
    assert out.dtype == mean.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), (y * torch.sigmoid(y)).half())


def test_batch_norm_reduce():
    x = torch.randn(2, 3, 4, 5).half()
    s, sq = torch_npu.batch_norm_reduce(x.to(NPU), 1e-5)
    xf = x.float()
    assert s.dtype == sq.dtype == torch.float32 and s.shape == (3,)
    torch.testing.assert_close(s.cpu(), torch.stack([xf[:, c].sum() for c in range(3)]))
    torch.testing.assert_close(sq.cpu(), torch.stack([(xf[:, c] ** 2).sum() for c in range(3)]))


@pytest.mark.parametrize("normalize_type", [0, 1])
def test_normalize_batch(normalize_type):
    x, seq = torch.rand(2, 3, 6, dtype=torch.float64) * 9 + 1, torch.tensor([3, 5], dtype=torch.int32)
    xn, xr = leaf(x), ref_leaf(x)
    rows = []
    for i in range(2):
        valid = xr[i, :, :seq[i]]
        if normalize_type == 0:
            mean, std = valid.mean(1, keepdim=True), valid.std(1, keepdim=True)
        else:
            mean, std = valid.mean(), valid.std()
        rows.append((xr[i] - mean) / (std + 1e-5))
    _check(torch_npu.npu_normalize_batch(xn, seq.to(NPU), normalize_type), torch.stack(rows), (xn,), (xr,))
    with pytest.raises(ValueError, match="normalize_type"):
        torch_npu.npu_normalize_batch(xn, seq.to(NPU), 2)


# ---- dropout -------------------------------------------------------------------------------------------------
def test_npu_dropout_mask_scale_and_backward():
    torch.npu.manual_seed(3)
    x = torch.randn(300, dtype=torch.float64)
    xn = leaf(x)
    out, mask = torch_npu._npu_dropout(xn, 0.3)
    assert mask.dtype == torch.uint8 and mask.shape == (384 // 8,)  # 300 elements round up to 3 blocks of 128
    keep = _bits(mask, 384)
    assert not keep[300:].any() and 0.55 < keep[:300].double().mean() < 0.85
    keep = keep[:300]
    torch.testing.assert_close(out.detach().cpu(), torch.where(keep, x / 0.7, 0.0))
    g = torch.randn(300, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(out, xn, g.to(NPU))[0].cpu(), torch.where(keep, g / 0.7, 0.0))
    zero, _ = torch_npu._npu_dropout(xn, 1.0)
    assert not zero.cpu().any()
    with pytest.raises(ValueError, match="drop probability"):
        torch_npu._npu_dropout(xn, 1.5)


def test_dropout_with_add_softmax():
    torch.npu.manual_seed(4)
    x, x1 = torch.rand(2, 4, 8, 16, dtype=torch.float64), torch.rand(2, 4, 8, 16, dtype=torch.float64)
    xn, x1n, xr, x1r = leaf(x), leaf(x1), ref_leaf(x), ref_leaf(x1)
    mask, soft, out = torch_npu.npu_dropout_with_add_softmax(xn, x1n, 2, 0.9, -1)
    keep = _bits(mask, x.numel()).view(x.shape)
    assert 0.05 < keep.double().mean() < 0.15  # prob 0.9 drops nine in ten
    y = x1r + 2 * xr
    e = torch.exp(y - y.max(-1, keepdim=True).values)
    ref_soft = e / e.sum(-1, keepdim=True)
    torch.testing.assert_close(soft.detach().cpu(), ref_soft.detach())
    _check(out, ref_soft * keep / 0.1, (xn, x1n), (xr, x1r))


# ---- sampling ---------------------------------------------------------------------------------------------------
def test_random_choice_with_mask():
    x = torch.tensor([1, 0, 1, 0], dtype=torch.bool)
    y, mask = torch_npu.npu_random_choice_with_mask(x.to(NPU), 2, 1, 0)
    assert y.dtype == torch.int32 and sorted(y.cpu().flatten().tolist()) == [0, 2] and mask.cpu().tolist() == [1, 1]
    y2, _ = torch_npu.npu_random_choice_with_mask(x.to(NPU), 2, 1, 0)
    assert y2.cpu().tolist() == y.cpu().tolist()  # fixed seeds: one order
    g = torch.rand(5, 6) > 0.5
    nz = {tuple(r) for r in g.nonzero().tolist()}
    y, mask = torch_npu.npu_random_choice_with_mask(g.to(NPU), 40)
    assert mask.cpu().sum() == len(nz) and not mask.cpu()[len(nz):].any()
    assert {tuple(r) for r in y.cpu()[:len(nz)].tolist()} == nz and not y.cpu()[len(nz):].any()
    y, mask = torch_npu.npu_random_choice_with_mask(g.to(NPU), 0)
    assert y.shape == (len(nz), 2) and mask.cpu().all()


def test_sim_exponential_fills_exponential_samples():
    gen = torch.Generator(device="npu")
    gen.manual_seed(0)
    a = torch.zeros(20000, device=NPU)
    assert torch_npu.npu_sim_exponential_(a, lambd=2.0, generator=gen) is a
    v = a.cpu()
    assert (v >= 0).all() and abs(v.mean().item() - 0.5) < 0.02 and abs(v.std().item() - 0.5) < 0.02
    # P(X > t) = exp(-lambda t)
    assert abs((v > 1.0).double().mean().item() - math.exp(-2.0)) < 0.01
    gen.manual_seed(0)
    b = torch.zeros(20000, device=NPU)
    torch_npu.npu_sim_exponential_(b, lambd=2.0, generator=gen)
    assert torch.equal(a.cpu(), b.cpu())
    with pytest.raises(ValueError, match="lambd"):
        torch_npu.npu_sim_exponential_(a, lambd=0.0)


def _ref_top_k_top_p(logits, p, k):
    """The documented steps per row, with Python lists."""
    out = []
    for b, row in enumerate(logits.tolist()):
        order = sorted(range(len(row)), key=lambda i: row[i])  # ascending, stable
        vals = [row[i] for i in order]
        if k is not None:
            kth = vals[len(vals) - int(k[b])]
            vals = [-math.inf if v < kth else v for v in vals]
        if p is not None:
            m = max(vals)
            ex = [math.exp(v - m) for v in vals]
            total, cum, filtered = sum(ex), 0.0, []
            for j, v in enumerate(vals):
                cum += ex[j] / total
                filtered.append(-math.inf if cum <= 1 - float(p[b]) and j < len(vals) - 1 else v)
            vals = filtered
        res = [0.0] * len(row)
        for j, i in enumerate(order):
            res[i] = vals[j]
        out.append(res)
    return torch.tensor(out, dtype=logits.dtype)


@pytest.mark.parametrize("use_p,use_k", [(True, True), (True, False), (False, True)])
def test_top_k_top_p(use_p, use_k):
    logits = torch.randn(4, 32, dtype=torch.float64)
    p, k = torch.tensor([0.5, 0.9, 0.1, 1.0], dtype=torch.float64), torch.tensor([1, 5, 32, 10], dtype=torch.int32)
    out = torch_npu.npu_top_k_top_p(logits.to(NPU), p.to(NPU) if use_p else None, k.to(NPU) if use_k else None)
    torch.testing.assert_close(out.cpu(), _ref_top_k_top_p(logits, p if use_p else None, k if use_k else None))
    with pytest.raises(ValueError, match="pass p, k"):
        torch_npu.npu_top_k_top_p(logits.to(NPU))


# ---- float status -------------------------------------------------------------------------------------------
def test_float_status():
    x = torch.randn(1, 2, 3, device=NPU)
    status = torch_npu.npu_alloc_float_status(x)
    assert status.device == x.device and status.dtype == torch.float32 and status.cpu().tolist() == [0.0] * 8
    assert torch_npu.npu_clear_float_status(status).cpu().tolist() == [0.0] * 8
    with pytest.raises(RuntimeError, match="npu_get_float_status: unsupported on a device with inf/nan"):
        torch_npu.npu_get_float_status(status)


# ---- convolution -------------------------------------------------------------------------------------------------
def test_conv_forms():
    x, w, b = torch.randn(2, 4, 7, 6, dtype=torch.float64), torch.randn(6, 2, 3, 3).double(), torch.randn(6).double()
    xn, wn, bn, xr, wr, br = leaf(x), leaf(w), leaf(b), ref_leaf(x), ref_leaf(w), ref_leaf(b)
    ref = F.conv2d(xr, wr, br, (2, 1), (1, 0), (1, 2), 2)
    _check(torch_npu.npu_conv2d(xn, wn, bn, [2, 1], [1, 0], [1, 2], 2), ref, (xn, wn, bn), (xr, wr, br))
    _check(torch_npu.npu_convolution(xn, wn, bn, [2, 1], [1, 0], [1, 2], 2), ref, (xn, wn, bn), (xr, wr, br))
    out = torch.empty(0, dtype=torch.float64, device=NPU)
    assert ops.npu_conv2d(xn.detach(), wn.detach(), None, [1], [1], [1], 2, out=out) is out
    torch.testing.assert_close(out.cpu(), F.conv2d(x, w, None, 1, 1, 1, 2))
    v, k = torch.randn(1, 2, 4, 5, 5, dtype=torch.float64), torch.randn(3, 2, 2, 3, 3, dtype=torch.float64)
    vn, kn, vr, kr = leaf(v), leaf(k), ref_leaf(v), ref_leaf(k)
    ref = F.conv3d(vr, kr, None, 1, [0, 1, 1], 1, 1)
    _check(torch_npu.npu_conv3d(vn, kn, None, [1, 1, 1], [0, 1, 1], [1, 1, 1], 1), ref, (vn, kn), (vr, kr))
    _check(torch_npu.npu_convolution(vn, kn, None, [1], [0, 1, 1], [1], 1), ref, (vn, kn), (vr, kr))
    wt = torch.randn(4, 3, 3, 3, dtype=torch.float64)  # (in_channels, out_channels / groups, kH, kW)
    wtn, wtr = leaf(wt), ref_leaf(wt)
    ref = F.conv_transpose2d(xr, wtr, None, 2, 1, 1, 1, 1)
    _check(torch_npu.npu_conv_transpose2d(xn, wtn, None, [1, 1], [1, 1], [2, 2], [1, 1], 1), ref, (xn, wtn),
           (xr, wtr))
    _check(torch_npu.npu_convolution_transpose(xn, wtn, None, [1], [1], [2], [1], 1), ref, (xn, wtn), (xr, wtr))
    with pytest.raises(ValueError, match="npu_conv3d"):
        torch_npu.npu_conv3d(xn, wn, None, [1], [0], [1], 1)


def test_norm_random_conv_compile():
    def fn(x, w, b):
        y, _, _ = ops.npu_group_norm_swish(x, 2, w, b, 1e-5, 1.0)
        y = ops.npu_conv2d(y, torch.ones(2, 4, 1, 1, dtype=x.dtype, device=x.device), None, [1], [0], [1], 1)
        out, _ = ops._npu_dropout(y, 0.0)
        return ops.npu_top_k_top_p(out.flatten(1), None, torch.full((2,), 3, dtype=torch.int32,
                                                                    device=x.device)).clamp(min=-1e4).sum()

    x, w, b = torch.randn(2, 4, 3, 3, dtype=torch.float64), torch.rand(4).double(), torch.rand(4).double()
    xe = leaf(x)
    ge = torch.autograd.grad(fn(xe, w.to(NPU), b.to(NPU)), xe)[0]
    xc = leaf(x)
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(xc, w.to(NPU), b.to(NPU))
    torch.testing.assert_close(torch.autograd.grad(out, xc)[0].cpu(), ge.cpu())


@pytest.mark.timeout(300)
def test_random_ops_opcheck():
    x = torch.randn(3, 5, device=NPU)
    torch.library.opcheck(ops._npu_dropout, (x, 0.0), test_utils=OPCHECK)
    torch.library.opcheck(ops.npu_dropout_with_add_softmax, (x, torch.randn(3, 5, device=NPU), 0.5, 0.0, -1),
                          test_utils=OPCHECK)
    for count in (4, 0):  # fixed, then data-dependent row count
        torch.library.opcheck(ops.npu_random_choice_with_mask, (x > 0, count, 7, 1), test_utils=OPCHECK)
