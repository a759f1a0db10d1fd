"""The batched gather matrix-vector product against a per-row loop of the documented update
y[i, off:off + H2] += scale * B[w, l] @ (A[w, l] @ x[i]), rows with a negative index unchanged."""
import pytest
import torch

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf


def _ref(y, x, wb, idx, wa, layer, scale, off):
    rows = []
    for i in range(y.shape[0]):
        row = y[i].clone()
        w = int(idx[i])
        if w >= 0:
            h = x[i] if wa is None else wa[w, layer] @ x[i]
            out = wb[w, layer] @ h
            row = torch.cat((row[:off], row[off:off + out.shape[0]] + scale * out, row[off + out.shape[0]:]))
        rows.append(row)
    return torch.stack(rows)


def _data(with_a, seed):
    g = torch.Generator().manual_seed(seed)
    y, x = torch.randn(5, 12, generator=g, dtype=torch.float64), torch.randn(5, 6, generator=g, dtype=torch.float64)
    wa = torch.randn(3, 2, 4, 6, generator=g, dtype=torch.float64) if with_a else None
    wb = torch.randn(3, 2, 7, 4 if with_a else 6, generator=g, dtype=torch.float64)
    idx = torch.tensor([0, -1, 2, 1, 2], dtype=torch.int32)
    return y, x, wb, idx, wa


@pytest.mark.parametrize("with_a", [True, False])
def test_batch_gather_matmul(with_a):
    y, x, wb, idx, wa = _data(with_a, 0)
    dev = [None if t is None else t.to(NPU) for t in (y, x, wb, idx, wa)]
    out = torch_npu.npu_batch_gather_matmul(*dev, layer_idx=1, scale=0.5, y_offset=3, y_slice_size=7)
    want = _ref(y, x, wb, idx, wa, 1, 0.5, 3)
    torch.testing.assert_close(out.cpu(), want)
    torch.testing.assert_close(dev[0].cpu(), y)  # the functional form leaves input alone
    # in place: input itself is updated and returned
    res = torch_npu.npu_batch_gather_matmul_(*dev, layer_idx=1, scale=0.5, y_offset=3)
    assert res is dev[0]
    torch.testing.assert_close(dev[0].cpu(), want)


def test_batch_gather_matmul_gradients():
    y, x, wb, idx, wa = _data(True, 1)
    n = [leaf(t) for t in (y, x, wb)] + [idx.to(NPU), leaf(wa)]
    r = [ref_leaf(t) for t in (y, x, wb)] + [idx, ref_leaf(wa)]
    out = torch_npu.npu_batch_gather_matmul(*n, scale=2.0)
    ref = _ref(*r, 0, 2.0, 0)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    dy = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    gn = torch.autograd.grad(out, [n[i] for i in (0, 1, 2, 4)], dy.to(NPU))
    gr = torch.autograd.grad(ref, [r[i] for i in (0, 1, 2, 4)], dy)
    for a, b in zip(gn, gr):
        torch.testing.assert_close(a.cpu(), b)


def test_batch_gather_matmul_half_and_bad_arguments():
    y, x, wb, idx, wa = (None if t is None else t.half() if t.is_floating_point() else t for t in _data(True, 3))
    out = torch_npu.npu_batch_gather_matmul(y.to(NPU), x.to(NPU), wb.to(NPU), idx.to(NPU), wa.to(NPU))
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().double(), _ref(y.double(), x.double(), wb.double(), idx, wa.double(), 0,
                                                        1e-3, 0), atol=2e-3, rtol=2e-3)
    dev = [t.to(NPU) for t in (y, x, wb, idx, wa)]
    for kw, word in ((dict(y_slice_size=5), "y_slice_size"), (dict(y_offset=8), "y_offset"),
                     (dict(layer_idx=2), "layer_idx")):
        with pytest.raises(ValueError, match=f"npu_batch_gather_matmul: {word}"):
            torch_npu.npu_batch_gather_matmul(*dev, **kw)
    with pytest.raises(ValueError, match="npu_batch_gather_matmul: weight_a must be"):
        torch_npu.npu_batch_gather_matmul(*dev[:4], dev[4][:, :, :3])


def test_batch_gather_matmul_compile():
    y, x, wb, idx, wa = (t.float() if t.is_floating_point() else t for t in _data(True, 4))

    def fn(y, x, wb, idx, wa):
        out = ops.npu_batch_gather_matmul(y, x, wb, idx, wa, scale=0.1, y_offset=2)
        y2 = y.clone()
        ops.npu_batch_gather_matmul_(y2, x, wb, idx, wa, scale=0.1, y_offset=2)
        return out, y2

    args = [t.to(NPU) for t in (y, x, wb, idx, wa)]
    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
    torch.testing.assert_close(eager[0].cpu(), eager[1].cpu())
