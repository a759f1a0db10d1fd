"""MoE gating operators (softmax top-k v1/v2, grouped softmax/sigmoid top-k and its backward) against per-row
reference loops written from torch_npu's documentation."""
import math

import pytest
import torch

import torch_npu
from tests.ops._common import NPU, leaf, ops, ref_leaf

F64 = torch.float64


def _softmax_row(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    return [v / sum(e) for v in e]


def _topk_row(row, k):
    order = sorted(range(len(row)), key=lambda i: -row[i])[:k]
    return [row[i] for i in order], order


@pytest.mark.timeout(120)
def test_gating_top_k_softmax_rows_finished_and_row_idx():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, dtype=F64)
    finished = torch.tensor([[False, True, False], [False, False, True]])
    y, idx, row_idx = torch_npu.npu_moe_gating_top_k_softmax(x.to(NPU), finished.to(NPU), k=2)
    rows = x.reshape(-1, 6).tolist()
    fin = finished.reshape(-1).tolist()
    assert idx.dtype == row_idx.dtype == torch.int32 and y.shape == (2, 3, 2)
    for r, row in enumerate(rows):
        vals, order = _topk_row(_softmax_row(row), 2)
        torch.testing.assert_close(y.reshape(-1, 2)[r].cpu(), torch.tensor(vals, dtype=F64))
        assert idx.reshape(-1, 2)[r].tolist() == ([6, 6] if fin[r] else order)
        assert row_idx.reshape(-1, 2)[r].tolist() == [r, r + len(rows)]  # j * rows + r


@pytest.mark.timeout(120)
@pytest.mark.parametrize("renorm,output_softmax", [(0, False), (0, True), (1, True)])
def test_gating_top_k_softmax_v2(renorm, output_softmax):
    torch.manual_seed(1)
    x = torch.randn(5, 7, dtype=F64)
    finished = torch.tensor([False, False, True, False, False])
    y, idx, soft = ops.npu_moe_gating_top_k_softmax_v2(x.to(NPU), k=3, finished=finished.to(NPU), renorm=renorm,
                                                       output_softmax=output_softmax)
    for r, row in enumerate(x.tolist()):
        if renorm == 0:
            vals, order = _topk_row(_softmax_row(row), 3)
        else:
            top, order = _topk_row(row, 3)
            vals = _softmax_row(top)
        torch.testing.assert_close(y[r].cpu(), torch.tensor(vals, dtype=F64))
        assert idx[r].tolist() == ([7] * 3 if finished[r] else order)
    if renorm == 0 and output_softmax:
        assert soft.dtype == torch.float32
        torch.testing.assert_close(soft.cpu(), torch.tensor([_softmax_row(r) for r in x.tolist()],
                                                            dtype=torch.float32))
    else:
        assert soft.shape == (0,)


def _ref_gating(x, k, bias=None, k_group=1, group_count=1, mode=0, norm_type=0, scale=1.0, eps=1e-20,
                input_ids=None, tid2eid=None):
    """Per-row loops: norm, biased group scores, group choice, top-k, renormalised weights (autograd through x)."""
    norm = torch.softmax(x, -1) if norm_type == 0 else torch.sigmoid(x)
    ys, idxs = [], []
    e = x.shape[1]
    size = e // group_count
    for r in range(x.shape[0]):
        if input_ids is not None:
            chosen = tid2eid[int(input_ids[r])].tolist()
        else:
            s = [float(norm[r, i].detach()) + (float(bias[i]) if bias is not None else 0.0) for i in range(e)]
            groups = [s[g * size:(g + 1) * size] for g in range(group_count)]
            gscore = [max(gr) if mode == 0 else sum(sorted(gr)[-2:]) for gr in groups]
            keep = sorted(range(group_count), key=lambda g: -gscore[g])[:k_group]
            eligible = [i for i in range(e) if i // size in keep]
            chosen = sorted(eligible, key=lambda i: -s[i])[:k]
        g = norm[r, chosen]
        ys.append(g / (g.sum() + eps) * scale)
        idxs.append(chosen)
    return torch.stack(ys), idxs, norm


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [
    dict(norm_type=0),
    dict(norm_type=1, scale=2.5),
    dict(norm_type=1, bias=True, group_count=4, k_group=2, mode=1),
    dict(norm_type=0, bias=True, group_count=4, k_group=3, mode=0, scale=0.5),
    dict(norm_type=1, hash=True),
])
def test_gating_top_k_forward_backward(case):
    torch.manual_seed(2)
    m, e, k = 5, 12, 3
    x = torch.randn(m, e, dtype=F64)
    bias = torch.rand(e, dtype=F64) if case.get("bias") else None
    input_ids = tid2eid = None
    if case.get("hash"):
        tid2eid = torch.stack([torch.randperm(e)[:k] for _ in range(7)]).to(torch.int32)
        input_ids = torch.randint(0, 7, (m,))
    kw = dict(k_group=case.get("k_group", 1), group_count=case.get("group_count", 1),
              group_select_mode=case.get("mode", 0), norm_type=case["norm_type"],
              routed_scaling_factor=case.get("scale", 1.0))
    xn, xr = leaf(x), ref_leaf(x)
    y, idx, norm = torch_npu.npu_moe_gating_top_k(
        xn, k, bias=None if bias is None else bias.to(NPU), input_ids=None if input_ids is None else input_ids.to(NPU),
        tid2eid=None if tid2eid is None else tid2eid.to(NPU), out_flag=True, **kw)
    ref_y, ref_idx, ref_norm = _ref_gating(xr, k, bias, kw["k_group"], kw["group_count"], kw["group_select_mode"],
                                           kw["norm_type"], kw["routed_scaling_factor"], input_ids=input_ids,
                                           tid2eid=tid2eid)
    assert idx.dtype == torch.int32 and idx.cpu().tolist() == ref_idx
    assert norm.dtype == torch.float32
    torch.testing.assert_close(norm.cpu(), ref_norm.detach().float())
    torch.testing.assert_close(y.detach().cpu(), ref_y.detach())
    g = torch.randn(m, k, dtype=F64)
    (dx,) = torch.autograd.grad(y, xn, g.to(NPU))
    (dr,) = torch.autograd.grad(ref_y, xr, g)
    torch.testing.assert_close(dx.cpu(), dr, atol=1e-6, rtol=1e-5)  # norm_out is float32 as on Ascend


@pytest.mark.timeout(120)
def test_gating_top_k_backward_operator_and_norm_out_gradient():
    torch.manual_seed(3)
    x = torch.randn(4, 9, dtype=torch.float32)
    xr = ref_leaf(x)
    y, idx, norm = ops.npu_moe_gating_top_k(x.to(NPU), 2, norm_type=1, routed_scaling_factor=1.5)
    gy = torch.randn(4, 2)
    dx = ops.npu_moe_gating_top_k_backward(norm, gy.to(NPU), idx, norm_type=1, routed_scaling_factor=1.5)
    ref_y, _, _ = _ref_gating(xr, 2, norm_type=1, scale=1.5)
    (dr,) = torch.autograd.grad(ref_y, xr, gy)
    torch.testing.assert_close(dx.cpu(), dr)
    # a loss on both y and norm_out: both paths reach x
    xn, xr = leaf(x), ref_leaf(x)
    y, _, norm = ops.npu_moe_gating_top_k(xn, 2, norm_type=0)
    ref_y, _, ref_norm = _ref_gating(xr, 2, norm_type=0)
    (dx,) = torch.autograd.grad((y * gy.to(NPU)).sum() + norm.pow(2).sum(), xn)
    (dr,) = torch.autograd.grad((ref_y * gy).sum() + ref_norm.pow(2).sum(), xr)
    torch.testing.assert_close(dx.cpu(), dr)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call,match", [
    (lambda x: ops.npu_moe_gating_top_k_softmax(x, None, 9), "npu_moe_gating_top_k_softmax: k"),
    (lambda x: ops.npu_moe_gating_top_k_softmax(x, torch.ones(3, dtype=torch.bool, device=NPU), 2), "finished"),
    (lambda x: ops.npu_moe_gating_top_k_softmax_v2(x, k=2, renorm=2), "renorm"),
    (lambda x: ops.npu_moe_gating_top_k(x, 2, group_count=3), "group_count"),
    (lambda x: ops.npu_moe_gating_top_k(x, 2, renorm=1), "renorm"),
    (lambda x: ops.npu_moe_gating_top_k(x, 2, norm_type=2), "norm_type"),
    (lambda x: ops.npu_moe_gating_top_k(x, 7, group_count=2, k_group=1), "npu_moe_gating_top_k: k"),
    (lambda x: ops.npu_moe_gating_top_k(x, 2, input_ids=torch.zeros(4, dtype=torch.int32, device=NPU)), "tid2eid"),
    (lambda x: ops.npu_moe_gating_top_k_backward(x, x[:, :2], x[:, :2].int()), "x_norm"),
])
def test_gating_invalid_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(4, 8, device=NPU, dtype=torch.float16))


@pytest.mark.timeout(300)
def test_gating_ops_compile_fullgraph():
    def fn(x, bias):
        y, idx, norm = torch_npu.npu_moe_gating_top_k(x, 2, bias=bias, group_count=2, k_group=1, norm_type=1)
        # the softmax forms are inference operators (no backward on Ascend)
        y1, i1, _ = torch_npu.npu_moe_gating_top_k_softmax(x.detach(), None, 2)
        y2, i2, s2 = torch_npu.npu_moe_gating_top_k_softmax_v2(x.detach(), k=2, renorm=1)
        return y.sum() + y1.sum() + y2.sum() + norm.sum(), idx, i1, i2

    x, bias = torch.randn(4, 8), torch.rand(8)
    xc, xe = leaf(x), leaf(x)
    out_c = torch.compile(fn, fullgraph=True, backend="aot_eager")(xc, bias.to(NPU))
    out_e = fn(xe, bias.to(NPU))
    for a, b in zip(out_c, out_e):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu())
    out_c[0].backward()
    out_e[0].backward()
    torch.testing.assert_close(xc.grad.cpu(), xe.grad.cpu())


OPCHECK = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.timeout(300)
def test_gating_opcheck():
    x = torch.randn(4, 12, device=NPU, requires_grad=True)
    torch.library.opcheck(ops._moe_gating_top_k, (x, torch.rand(12, device=NPU), None, None, 3, 2, 4, 1, 0, 1, 1.5,
                                                  1e-20), test_utils=OPCHECK)
    torch.library.opcheck(ops.npu_moe_gating_top_k_softmax, (x.detach(), None, 2), test_utils=OPCHECK)
    torch.library.opcheck(ops._moe_gating_top_k_softmax_v2, (x.detach(), None, 2, 0, True), test_utils=OPCHECK)
    norm = torch.rand(4, 12, device=NPU)
    torch.library.opcheck(ops.npu_moe_gating_top_k_backward,
                          (norm, torch.randn(4, 2, device=NPU), torch.randint(0, 12, (4, 2), device=NPU).int()),
                          dict(norm_type=1), test_utils=OPCHECK)
