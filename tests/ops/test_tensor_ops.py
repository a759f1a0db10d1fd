"""torch_npu's general tensor operators against references written here from its documentation (the documented
examples where they print values, plain loops or numpy otherwise)."""
import numpy as np
import pytest
import torch

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf


def _grads(out, ins, g):
    return torch.autograd.grad(out, ins, g, retain_graph=True)


def _check_grad(out_n, out_r, ins_n, ins_r, seed=0):
    g = torch.randn(out_r.shape, dtype=out_r.dtype, generator=torch.Generator().manual_seed(seed))
    for a, b in zip(_grads(out_n, ins_n, g.to(NPU)), _grads(out_r, ins_r, g)):
        torch.testing.assert_close(a.cpu(), b)


def test_linear_and_bmm_v2():
    x, w, b = torch.randn(2, 16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64), torch.randn(4).double()
    xn, wn, bn, xr, wr, br = leaf(x), leaf(w), leaf(b), ref_leaf(x), ref_leaf(w), ref_leaf(b)
    out, ref = torch_npu.npu_linear(xn, wn, bn), xr @ wr.T + br
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    _check_grad(out, ref, (xn, wn, bn), (xr, wr, br))
    with pytest.raises(ValueError, match="npu_linear"):
        torch_npu.npu_linear(xn, wn.T)
    a, m = torch.randn(10, 3, 4, dtype=torch.float64), torch.randn(10, 4, 5, dtype=torch.float64)
    an, mn, ar, mr = leaf(a), leaf(m), ref_leaf(a), ref_leaf(m)
    out = torch_npu.npu_bmmV2(an, mn, [])
    ref = (ar.unsqueeze(-1) * mr.unsqueeze(1)).sum(2)  # sum_k a[b, i, k] m[b, k, j]
    assert out.shape == (10, 3, 5)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    _check_grad(out, ref, (an, mn), (ar, mr))
    assert torch_npu.npu_bmmV2(an, mn, [10, 3, 5]).shape == (10, 3, 5)
    with pytest.raises(ValueError, match="output_sizes"):
        torch_npu.npu_bmmV2(an, mn, [10, 5, 3])


def test_transpose_batchmatmul():
    m, b, k, n = 3, 2, 4, 5
    x1, x2, bias = (torch.randn(m, b, k, dtype=torch.float64), torch.randn(b, k, n, dtype=torch.float64),
                    torch.randn(n, dtype=torch.float64))
    n1, n2, nb, r1, r2, rb = leaf(x1), leaf(x2), leaf(bias), ref_leaf(x1), ref_leaf(x2), ref_leaf(bias)
    out = torch_npu.npu_transpose_batchmatmul(n1, n2, bias=nb, perm_x1=[1, 0, 2], perm_y=[1, 0, 2])
    ref = torch.stack([r1[:, i] @ r2[i] for i in range(b)], 1) + rb  # y[m, b, :] = x1[m, b] @ x2[b] + bias
    assert out.shape == (m, b, n)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    _check_grad(out, ref, (n1, n2, nb), (r1, r2, rb))
    with pytest.raises(ValueError, match="scale"):
        torch_npu.npu_transpose_batchmatmul(n1, n2, scale=torch.ones(b * n, dtype=torch.int64, device=NPU),
                                            perm_x1=[1, 0, 2])
    with pytest.raises(ValueError, match="batch_split_factor"):
        torch_npu.npu_transpose_batchmatmul(n1, n2, perm_x1=[1, 0, 2], batch_split_factor=2)


@pytest.mark.parametrize("name", ["npu_max", "npu_min"])
def test_max_min_return_int32_indices(name):
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    xn, xr = leaf(x), ref_leaf(x)
    values, indices = getattr(torch_npu, name)(xn, 1)
    pick = max if name == "npu_max" else min
    ref_idx = torch.tensor([[[pick(range(3), key=lambda i: x[a, i, c]) for c in range(4)] for a in range(2)]])[0]
    assert indices.dtype == torch.int32 and indices.cpu().tolist() == ref_idx.tolist()
    ref = xr.gather(1, ref_idx.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(values.detach().cpu(), ref.detach())
    _check_grad(values, ref, (xn,), (xr,))
    v, i = getattr(ops, name).dim(xn, -1, True)
    assert v.shape == i.shape == (2, 3, 1)


def test_slice_reshape_sort_examples():
    x = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], dtype=torch.float16)
    assert torch_npu.npu_slice(x.to(NPU), [0, 0], [2, 2]).cpu().tolist() == [[1, 2], [6, 7]]
    assert torch_npu.npu_slice(x.to(NPU), [1, 2], [1, -1]).cpu().tolist() == [[8, 9, 10]]
    with pytest.raises(ValueError, match="npu_slice"):
        torch_npu.npu_slice(x.to(NPU), [1, 2], [2, 1])
    y = torch.randn(3, 4, dtype=torch.float64)
    yn, yr = leaf(y), ref_leaf(y)
    out, ref = torch_npu.npu_slice(yn, [1, 1], [2, 3]), yr[1:3, 1:4]
    _check_grad(out, ref, (yn,), (yr,))
    r = torch_npu.npu_reshape(yn, (4, 3))
    assert r.shape == (4, 3) and r.cpu().flatten().tolist() == y.flatten().tolist()
    assert r.data_ptr() != yn.data_ptr()
    s = torch.randn(3, 6)
    assert torch_npu.npu_sort_v2(s.to(NPU)).cpu().tolist() == [sorted(row) for row in s.tolist()]
    assert torch_npu.npu_sort_v2(s.to(NPU), descending=True).cpu().tolist() == [
        sorted(row, reverse=True) for row in s.tolist()]
    out = torch.empty(0, device=NPU)
    assert ops.npu_sort_v2(s.to(NPU), out=out) is out and out.shape == (3, 6)


@pytest.mark.parametrize("args,np_index", [
    (([0, 0], [2, 2], [1, 1]), (slice(0, 2), slice(0, 2))),                       # the documented example
    (([1, -1], [0, 0], [-1, -2], 0, 2), (slice(1, 0, -1), slice(-1, None, -2))),  # end_mask on dim 1
    (([0, 1], [0, 3], [1, 1], 1), (slice(None, 0), slice(1, 3))),                 # begin_mask on dim 0
    (([1, 0, 2], [2, 0, 5], [1, 1, 2], 0, 0, 2), (slice(1, 2), Ellipsis, slice(2, 5, 2))),
    (([0, 0, 1], [1, 0, 3], [1, 1, 1], 0, 0, 0, 2, 1), (0, None, slice(1, 3))),  # shrink, new axis
    (([-2], [10], [1]), (slice(-2, 10),)),                                        # clamped end
])
def test_indexing_is_a_strided_slice(args, np_index):
    x = np.arange(3 * 5, dtype=np.float64).reshape(3, 5)
    out = torch_npu.npu_indexing(torch.from_numpy(x).to(NPU), *args)
    np.testing.assert_array_equal(out.cpu().numpy(), x[np_index])


def test_indexing_backward_and_errors():
    x = torch.randn(4, 6, dtype=torch.float64)
    xn, xr = leaf(x), ref_leaf(x)
    out = torch_npu.npu_indexing(xn, [3, 1], [0, 6], [-1, 2])
    ref = xr.flip(0)[0:3, 1:6:2]
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    _check_grad(out, ref, (xn,), (xr,))
    with pytest.raises(ValueError, match="nonzero"):
        torch_npu.npu_indexing(xn, [0], [1], [0])


def test_one_copy_memory_fast_gelu():
    x = torch.rand(2, 3).to(NPU)
    assert torch_npu.one_(x) is x and x.cpu().tolist() == [[1.0] * 3] * 2
    a, b = torch.tensor([0, 0, -1], dtype=torch.int32).to(NPU), torch.tensor([1, 1, 1], dtype=torch.int32).to(NPU)
    assert torch_npu.copy_memory_(a, b) is a and a.cpu().tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="copy_memory_"):
        torch_npu.copy_memory_(a, b.float())
    with pytest.raises(ValueError, match="npu tensors"):
        torch_npu.copy_memory_(a, torch.ones(3, dtype=torch.int32))
    v = torch.randn(7, dtype=torch.float64)
    vn, vr = leaf(v), ref_leaf(v)
    out, ref = torch_npu.fast_gelu(vn), vr / (1 + torch.exp(-1.702 * vr))
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    _check_grad(out, ref, (vn,), (vr,))


def test_gather_sparse_index_and_softmax_cross_entropy():
    x = torch.randn(16, 5, dtype=torch.float64)
    idx = torch.randint(0, 16, (2, 3))
    xn, xr = leaf(x), ref_leaf(x)
    out = torch_npu.npu_gather_sparse_index(xn, idx.to(NPU))
    ref = torch.stack([torch.stack([xr[idx[i, j]] for j in range(3)]) for i in range(2)])
    assert out.shape == (2, 3, 5)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    _check_grad(out, ref, (xn,), (xr,))
    f, lab = torch.randn(4, 6, dtype=torch.float64), torch.softmax(torch.randn(4, 6, dtype=torch.float64), -1)
    fn_, fr = leaf(f), ref_leaf(f)
    out = torch_npu.npu_softmax_cross_entropy_with_logits(fn_, lab.to(NPU))
    ref = -(lab * (fr - torch.log(torch.exp(fr).sum(-1, keepdim=True)))).sum(-1)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    _check_grad(out, ref, (fn_,), (fr,))


def test_masked_fill_range_example_and_later_masks_win():
    a = torch.rand(4, 4)
    out = torch_npu.npu_masked_fill_range(a.to(NPU), torch.tensor([[0, 1, 2]], dtype=torch.int32).to(NPU),
                                          torch.tensor([[1, 2, 3]], dtype=torch.int32).to(NPU),
                                          torch.tensor([1.0]).to(NPU), 1)
    ref = a.clone()
    for i in range(3):
        ref[i, i] = 1.0
    torch.testing.assert_close(out.cpu(), ref)
    start = torch.tensor([[0, 2], [1, 0]], dtype=torch.int32)
    end = torch.tensor([[3, 4], [2, 1]], dtype=torch.int32)
    out = torch_npu.npu_masked_fill_range(a[:2].to(NPU), start.to(NPU), end.to(NPU), torch.tensor([7., 9.]).to(NPU))
    ref = a[:2].clone()
    for m, val in enumerate((7.0, 9.0)):
        for n in range(2):
            ref[n, start[m, n]:end[m, n]] = val
    torch.testing.assert_close(out.cpu(), ref)


def test_stride_add_adds_channel_blocks_of_16():
    a = torch.tensor([[[[[1.0]]]]])
    out = torch_npu.npu_stride_add(a.to(NPU), a.to(NPU), 0, 0, 1)  # the documented example
    assert out.shape == (1, 16, 1, 1, 1) and out.cpu().flatten().tolist() == [2.0] + [0.0] * 15
    x1, x2 = torch.randn(2, 40, 3, dtype=torch.float64), torch.randn(2, 20, 3, dtype=torch.float64)
    n1, n2, r1, r2 = leaf(x1), leaf(x2), ref_leaf(x1), ref_leaf(x2)
    out = torch_npu.npu_stride_add(n1, n2, 1, 0, 2)  # x1 blocks 1-2 (channels 16..47) + x2 blocks 0-1 (0..31)
    z1, z2 = torch.zeros(2, 8, 3, dtype=torch.float64), torch.zeros(2, 12, 3, dtype=torch.float64)
    ref = torch.cat((r1[:, 16:40], z1), 1) + torch.cat((r2, z2), 1)
    _check_grad(out, ref, (n1, n2), (r1, r2))
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    with pytest.raises(ValueError, match="channel blocks"):
        torch_npu.npu_stride_add(n1, n2, 2, 0, 2)


def test_sign_bits_pack_unpack_examples():
    a = torch.tensor([5, 4, 3, 2, 0, -1, -2, 4, 3, 2, 1, 0, -1, -2], dtype=torch.float32)
    packed = torch_npu.npu_sign_bits_pack(a.to(NPU), 2)
    assert packed.dtype == torch.uint8 and packed.cpu().tolist() == [[159], [15]]
    out = torch_npu.npu_sign_bits_unpack(torch.tensor([159, 15], dtype=torch.uint8).to(NPU), 2, torch.float32)
    assert out.cpu().tolist() == [[1., 1., 1., 1., 1., -1., -1., 1.], [1., 1., 1., 1., -1., -1., -1., -1.]]
    assert torch_npu.npu_sign_bits_unpack(packed.view(-1), 1, torch.float16).dtype == torch.float16
    with pytest.raises(ValueError, match="size"):
        torch_npu.npu_sign_bits_pack(a.to(NPU), 3)


def test_scatter_forms():
    inp = torch.tensor([[1.6279, 0.1226], [0.9041, 1.0980]], dtype=torch.float64)
    n, r = leaf(inp), ref_leaf(inp)
    upd = torch.tensor([-1.1993, -1.5247], dtype=torch.float64)
    un, ur = leaf(upd), ref_leaf(upd)
    out = torch_npu.npu_scatter(n, torch.tensor([0, 1], dtype=torch.int32).to(NPU), un, 0)
    ref = torch.stack((torch.stack((ur[0], r[0, 1])), torch.stack((r[1, 0], ur[1]))))  # the documented example
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    _check_grad(out, ref, (n, un), (r, ur))
    # scatter_nd_update: input (4, 5, 6), indices (3, 2) -> updates (3, 6)
    x, idx, u = torch.randn(4, 5, 6), torch.tensor([[0, 1], [3, 4], [2, 0]]), torch.randn(3, 6)
    ref = x.clone()
    for i in range(3):
        ref[idx[i, 0], idx[i, 1]] = u[i]
    torch.testing.assert_close(torch_npu.npu_scatter_nd_update(x.to(NPU), idx.int().to(NPU), u.to(NPU)).cpu(), ref)
    xn = x.to(NPU)
    assert torch_npu.npu_scatter_nd_update_(xn, idx.to(NPU), u.to(NPU)) is xn
    torch.testing.assert_close(xn.cpu(), ref)
    with pytest.raises(ValueError, match="updates must have shape"):
        torch_npu.npu_scatter_nd_update(x.to(NPU), idx.to(NPU), torch.randn(3, 5).to(NPU))


def test_scatter_update_writes_each_batch_row_at_its_offset():
    data = torch.tensor([[[[1] * 8, [2] * 8]]], dtype=torch.float32)
    upd = torch.tensor([[[[3] * 8]]], dtype=torch.float32)
    out = torch_npu.scatter_update(data.to(NPU), torch.tensor([1]).to(NPU), upd.to(NPU), axis=-2)
    assert out.cpu().tolist() == [[[[1] * 8, [3] * 8]]] and data[0, 0, 1, 0] == 2  # the documented example
    d, u, idx = torch.randn(3, 2, 6, 4), torch.randn(3, 2, 2, 4), torch.tensor([0, 4, 2])
    ref = d.clone()
    for i in range(3):
        for k in range(2):
            ref[i, :, idx[i] + k, :] = u[i, :, k, :]
    dn = d.to(NPU)
    assert torch_npu.scatter_update_(dn, idx.int().to(NPU), u.to(NPU), 2) is dn
    torch.testing.assert_close(dn.cpu(), ref)
    with pytest.raises(ValueError, match="2-D form"):
        torch_npu.scatter_update(d.to(NPU), torch.zeros(3, 2, dtype=torch.long).to(NPU), u.to(NPU), 2)


def test_apply_adam_w_out_updates_and_returns_the_state():
    var, m, v, g = torch.randn(5), torch.randn(5), torch.rand(5), torch.randn(5)
    lr, wd, b1, b2, eps, step = 0.01, 0.1, 0.9, 0.99, 1e-8, 3
    state = [t.to(NPU) for t in (var, m, v)]
    res = torch_npu.npu_apply_adam_w_out(b1 ** (step - 1), b2 ** (step - 1), lr, wd, b1, b2, eps, g.to(NPU), None,
                                         False, False, *state)
    assert all(a is b for a, b in zip(res, state))
    m_ref, v_ref = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    var_ref = var * (1 - lr * wd) - lr * (m_ref / (1 - b1 ** step)) / ((v_ref / (1 - b2 ** step)).sqrt() + eps)
    for a, b in zip(state, (var_ref, m_ref, v_ref)):
        torch.testing.assert_close(a.cpu(), b)


def test_tensor_ops_compile():
    def fn(x, w, idx):
        y = ops.npu_linear(x, w, None)
        y = ops.npu_indexing(ops.npu_slice(y, [0, 1], [4, 3]), [3, 0], [0, 3], [-1, 1], 0, 0, 0, 0, 0)
        v, _ = ops.npu_max(y, 1)
        return v.sum() + ops.npu_gather_sparse_index(x, idx).sum() + ops.fast_gelu(y).sum()

    x, w, idx = torch.randn(5, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64), torch.tensor([1, 3])
    xe = leaf(x)
    ge = torch.autograd.grad(fn(xe, w.to(NPU), idx.to(NPU)), xe)[0]
    xc = leaf(x)
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(xc, w.to(NPU), idx.to(NPU))
    torch.testing.assert_close(torch.autograd.grad(out, xc)[0].cpu(), ge.cpu())
