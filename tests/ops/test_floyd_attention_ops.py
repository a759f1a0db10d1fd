"""npu_fused_floyd_attention against a per-(b, h, m, n) loop of the page's formula
P = softmax(scale (q.k_ij + q.k_jk) masked), out = P v_ij + P v_jk, with the gradients of that loop."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf


def _ref(q, kij, vij, kjk, vjk, mask, scale):
    b, h, m, n, _ = q.shape
    k = kij.shape[3]
    outs, maxes, sums = [], [], []
    for bi in range(b):
        for hi in range(h):
            for mi in range(m):
                for ni in range(n):
                    keep = [kk for kk in range(k) if mask is None or not mask[bi, 0, mi, 0, kk]]
                    if not keep:
                        outs.append(vij[bi, hi, mi, 0] * 0)
                        maxes.append(0.0)
                        sums.append(0.0)
                        continue
                    s = torch.stack([scale * (q[bi, hi, mi, ni] @ kij[bi, hi, mi, kk]
                                              + q[bi, hi, mi, ni] @ kjk[bi, hi, kk, ni]) for kk in keep])
                    p = torch.softmax(s, 0)
                    outs.append(sum(p[t] * (vij[bi, hi, mi, kk] + vjk[bi, hi, kk, ni]) for t, kk in enumerate(keep)))
                    maxes.append(s.max().item())
                    sums.append(sum(math.exp(v - s.max().item()) for v in s.tolist()))
    out = torch.stack(outs).reshape(b, h, m, n, -1)
    stat = lambda v: torch.tensor(v).reshape(b, h, m, n, 1).expand(b, h, m, n, 8).float()  # noqa: E731
    return out, stat(maxes), stat(sums)


def _rand(*shape, seed):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_mask", [False, True])
def test_floyd_attention_forward_and_backward(with_mask):
    b, h, m, n, k, d = 1, 2, 3, 2, 4, 5
    ins = [_rand(b, h, m, n, d, seed=0), _rand(b, h, m, k, d, seed=1), _rand(b, h, m, k, 3, seed=2),
           _rand(b, h, k, n, d, seed=3), _rand(b, h, k, n, 3, seed=4)]
    mask = None
    if with_mask:
        mask = torch.rand(b, 1, m, 1, k, generator=torch.Generator().manual_seed(5)) > 0.6
        mask[0, 0, 1] = True  # every k masked for m = 1: output 0
    nn = [leaf(t) for t in ins]
    rr = [ref_leaf(t) for t in ins]
    smax, ssum, out = torch_npu.npu_fused_floyd_attention(*nn, atten_mask=None if mask is None else mask.to(NPU),
                                                           scale_value=0.4)
    ref, rmax, rsum = _ref(*rr, mask, 0.4)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    torch.testing.assert_close(smax.cpu(), rmax)
    torch.testing.assert_close(ssum.cpu(), rsum)
    dy = _rand(*ref.shape, seed=6)
    for a, c in zip(torch.autograd.grad(out, nn, dy.to(NPU)), torch.autograd.grad(ref, rr, dy)):
        torch.testing.assert_close(a.cpu(), c)


def test_floyd_attention_bfloat16_and_bad_shapes():
    g = torch.Generator().manual_seed(7)
    q, kij, vij = (torch.randn(1, 1, 2, 3, 8, generator=g), torch.randn(1, 1, 2, 4, 8, generator=g),
                   torch.randn(1, 1, 2, 4, 8, generator=g))
    kjk, vjk = torch.randn(1, 1, 4, 3, 8, generator=g), torch.randn(1, 1, 4, 3, 8, generator=g)
    _, _, out = torch_npu.npu_fused_floyd_attention(*(t.bfloat16().to(NPU) for t in (q, kij, vij, kjk, vjk)))
    assert out.dtype == torch.bfloat16
    ref, _, _ = _ref(*(t.bfloat16().double() for t in (q, kij, vij, kjk, vjk)), None, 1.0)
    torch.testing.assert_close(out.cpu().double(), ref, atol=5e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="npu_fused_floyd_attention: key_jk must be"):
        torch_npu.npu_fused_floyd_attention(*(t.to(NPU) for t in (q, kij, vij, kjk[:, :, :3], vjk)))
    with pytest.raises(ValueError, match="npu_fused_floyd_attention: atten_mask"):
        torch_npu.npu_fused_floyd_attention(*(t.to(NPU) for t in (q, kij, vij, kjk, vjk)),
                                            atten_mask=torch.ones(2, 5, dtype=torch.bool).to(NPU))


def test_floyd_attention_compile():
    g = torch.Generator().manual_seed(8)
    ins = [torch.randn(1, 1, 2, 3, 4, generator=g), torch.randn(1, 1, 2, 5, 4, generator=g),
           torch.randn(1, 1, 2, 5, 4, generator=g), torch.randn(1, 1, 5, 3, 4, generator=g),
           torch.randn(1, 1, 5, 3, 4, generator=g)]

    def fn(*xs):
        return ops.npu_fused_floyd_attention(*xs, scale_value=0.5)[2].square().sum()

    grads = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        xs = [leaf(t) for t in ins]
        f(*xs).backward()
        grads.append([t.grad.cpu() for t in xs])
    for a, c in zip(*grads):
        torch.testing.assert_close(a, c)
