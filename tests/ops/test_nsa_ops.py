"""npu_nsa_compress against a per-batch, per-window loop of the documented sliding-window weighted sum, with the
gradients of that loop."""
import pytest
import torch

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf


def _ref(x, w, block, stride, ends):
    outs, begin = [], 0
    for end in ends:
        s = begin
        while s + block <= end:
            outs.append(sum(w[k][:, None] * x[s + k] for k in range(block)))
            s += stride
        begin = end
    return torch.stack(outs)


@pytest.mark.parametrize("block,stride", [(4, 2), (4, 4), (3, 1)])
def test_nsa_compress_forward_and_backward(block, stride):
    g = torch.Generator().manual_seed(0)
    ends = [7, 9, 20]  # batch 2 (2 tokens) is shorter than a window: no windows
    x, w = torch.randn(20, 3, 5, generator=g, dtype=torch.float64), torch.randn(block, 3, generator=g,
                                                                                 dtype=torch.float64)
    xn, wn, xr, wr = leaf(x), leaf(w), ref_leaf(x), ref_leaf(w)
    out = torch_npu.npu_nsa_compress(xn, wn, block, stride, actual_seq_len=ends)
    ref = _ref(xr, wr, block, stride, ends)
    assert out.shape == ref.shape
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    dy = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(out, (xn, wn), dy.to(NPU)), torch.autograd.grad(ref, (xr, wr), dy)):
        torch.testing.assert_close(a.cpu(), b)


def test_nsa_compress_half_and_bad_arguments():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(32, 2, 16, generator=g).half(), torch.randn(16, 2, generator=g).half()
    out = torch_npu.npu_nsa_compress(x.to(NPU), w.to(NPU), 16, 16, actual_seq_len=[32])
    assert out.dtype == torch.float16 and out.shape == (2, 2, 16)
    torch.testing.assert_close(out.cpu().float(), _ref(x.float(), w.float(), 16, 16, [32]), atol=1e-2, rtol=1e-2)
    for args, kw, word in (((16, 32), dict(actual_seq_len=[32]), "compress_stride"),
                           ((16, 16), dict(actual_seq_len=[30]), "actual_seq_len"),
                           ((16, 16), dict(), "actual_seq_len"), ((8, 8), dict(actual_seq_len=[32]), "weight")):
        with pytest.raises(ValueError, match=f"npu_nsa_compress: .*{word}"):
            torch_npu.npu_nsa_compress(x.to(NPU), w.to(NPU), *args, **kw)


def test_nsa_compress_compile():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(12, 2, 4, generator=g), torch.randn(4, 2, generator=g)

    def fn(x, w):
        return ops.npu_nsa_compress(x, w, 4, 2, actual_seq_len=[5, 12]).square().sum()

    grads = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        ins = [leaf(x), leaf(w)]
        f(*ins).backward()
        grads.append([t.grad.cpu() for t in ins])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
