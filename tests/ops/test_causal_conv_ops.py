"""The masked causal depthwise conv1d against a per-element loop of the documented window sum (taps in conv1d
order, weight[W - 1] on the current position), with the gradients of that loop from autograd."""
import pytest
import torch

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf


def _reference(x, w, mask):
    s_len, b_len, _ = x.shape
    width = w.shape[0]
    rows = []
    for s in range(s_len):
        per_b = []
        for b in range(b_len):
            acc = torch.zeros_like(x[0, 0])
            for k in range(width):
                t = s - (width - 1) + k
                if t >= 0:
                    acc = acc + w[k] * x[t, b]
            if mask is not None and not mask[b, s]:
                acc = acc * 0
            per_b.append(acc)
        rows.append(torch.stack(per_b))
    return torch.stack(rows)


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("width", [3, 2])
def test_masked_causal_conv1d_forward_and_backward(with_mask, width):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(6, 2, 8, generator=g, dtype=torch.float64), torch.randn(width, 8, generator=g,
                                                                                dtype=torch.float64)
    mask = torch.rand(2, 6, generator=g) > 0.3 if with_mask else None
    xn, wn, xr, wr = leaf(x), leaf(w), ref_leaf(x), ref_leaf(w)
    out = torch_npu.npu_masked_causal_conv1d(xn, wn, mask=None if mask is None else mask.to(NPU))
    ref = _reference(xr, wr, mask)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    dy = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    gn = torch.autograd.grad(out, (xn, wn), dy.to(NPU))
    gr = torch.autograd.grad(ref, (xr, wr), dy)
    for a, b in zip(gn, gr):
        torch.testing.assert_close(a.cpu(), b)
    # the public backward operator gives the same gradients
    gx, gw = torch_npu.npu_masked_causal_conv1d_backward(dy.to(NPU), x.to(NPU), w.to(NPU),
                                                         mask=None if mask is None else mask.to(NPU))
    torch.testing.assert_close(gx.cpu(), gr[0])
    torch.testing.assert_close(gw.cpu(), gr[1])


def test_masked_causal_conv1d_bfloat16_keeps_dtype():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 3, 64, generator=g).bfloat16(), torch.randn(3, 64, generator=g).bfloat16()
    out = torch_npu.npu_masked_causal_conv1d(x.to(NPU), w.to(NPU))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), _reference(x.float(), w.float(), None), atol=2e-2, rtol=2e-2)


def test_masked_causal_conv1d_rejects_bad_arguments():
    x, w = torch.randn(4, 2, 8).to(NPU), torch.randn(3, 8).to(NPU)
    with pytest.raises(ValueError, match="npu_masked_causal_conv1d: weight must be"):
        torch_npu.npu_masked_causal_conv1d(x, torch.randn(3, 4).to(NPU))
    with pytest.raises(ValueError, match="npu_masked_causal_conv1d: mask must be"):
        torch_npu.npu_masked_causal_conv1d(x, w, mask=torch.ones(4, 2, dtype=torch.bool).to(NPU))
    with pytest.raises(ValueError, match="npu_masked_causal_conv1d: weight's dtype"):
        torch_npu.npu_masked_causal_conv1d(x, w.half())
    with pytest.raises(ValueError, match="npu_masked_causal_conv1d: input must be 3-D"):
        torch_npu.npu_masked_causal_conv1d(x[0], w)


def test_masked_causal_conv1d_compile():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 2, 8, generator=g), torch.randn(3, 8, generator=g)
    mask = (torch.rand(2, 5, generator=g) > 0.5).to(NPU)

    def fn(x, w):
        return (ops.npu_masked_causal_conv1d(x, w, mask=mask) ** 2).sum()

    grads = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        ins = [leaf(x), leaf(w)]
        f(*ins).backward()
        grads.append([t.grad.cpu() for t in ins])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
