"""npu_mhc_post against a per-stream loop of the page's formula x_{l+1} = h_res^T x_l + h_out (x) h_post, with
the gradients of that loop."""
import pytest
import torch

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf


def _ref(x, h_res, h_out, h_post):
    """x (T, n, D) (leading dims flattened by the caller)."""
    t_len, n, _ = x.shape
    rows = []
    for t in range(t_len):
        streams = []
        for i in range(n):
            mix = x[t, i] if h_res is None else sum(h_res[t, j, i] * x[t, j] for j in range(n))
            streams.append(mix + h_post[t, i] * h_out[t])
        rows.append(torch.stack(streams))
    return torch.stack(rows)


def _rand(*shape, seed):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_res", [True, False])
@pytest.mark.parametrize("lead", [(3,), (2, 2)])
def test_mhc_post_forward_and_backward(with_res, lead):
    n, d = 4, 5
    x, h_out, h_post = _rand(*lead, n, d, seed=0), _rand(*lead, d, seed=1), _rand(*lead, n, seed=2)
    h_res = torch.softmax(_rand(*lead, n, n, seed=3), -1) if with_res else None
    ins = [x, h_res, h_out, h_post]
    nn = [None if t is None else leaf(t) for t in ins]
    rr = [None if t is None else ref_leaf(t) for t in ins]
    out = torch_npu.npu_mhc_post(*nn)
    flat = [None if t is None else t.reshape(-1, *t.shape[len(lead):]) for t in rr]
    ref = _ref(*flat).reshape(x.shape)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    dy = _rand(*x.shape, seed=4)
    live_n = [t for t in nn if t is not None]
    live_r = [t for t in rr if t is not None]
    for a, b in zip(torch.autograd.grad(out, live_n, dy.to(NPU)), torch.autograd.grad(ref, live_r, dy)):
        torch.testing.assert_close(a.cpu(), b)
    # the public backward: grad_h_res comes out even without h_res (x_j . g_i at [j, i])
    gx, gres, gout, gpost = torch_npu.npu_mhc_post_backward(dy.to(NPU), x.to(NPU), None if h_res is None else
                                                            h_res.to(NPU), h_out.to(NPU), h_post.to(NPU))
    assert gres.shape == (*lead, n, n)
    torch.testing.assert_close(gres.cpu(), torch.einsum("...jd,...id->...ji", x, dy))
    torch.testing.assert_close(gout.cpu(), (h_post.unsqueeze(-1) * dy).sum(-2))


def test_mhc_post_bfloat16_and_bad_shapes():
    x, h_out, h_post = torch.randn(2, 4, 8).bfloat16(), torch.randn(2, 8).bfloat16(), torch.rand(2, 4)
    h_res = torch.softmax(torch.randn(2, 4, 4), -1)
    out = torch_npu.npu_mhc_post(x.to(NPU), h_res.to(NPU), h_out.to(NPU), h_post.to(NPU))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), _ref(x.float(), h_res, h_out.float(), h_post), atol=3e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="npu_mhc_post: h_post must be"):
        torch_npu.npu_mhc_post(x.to(NPU), h_res.to(NPU), h_out.to(NPU), h_post[:, :3].to(NPU))
    with pytest.raises(ValueError, match="npu_mhc_post: h_res must be"):
        torch_npu.npu_mhc_post(x.to(NPU), h_res[:1].to(NPU), h_out.to(NPU), h_post.to(NPU))


def test_mhc_post_compile():
    x, h_res, h_out, h_post = torch.randn(3, 4, 6), torch.rand(3, 4, 4), torch.randn(3, 6), torch.rand(3, 4)

    def fn(x, h_res, h_out, h_post):
        return ops.npu_mhc_post(x, h_res, h_out, h_post).square().sum()

    grads = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        ins = [leaf(t) for t in (x, h_res, h_out, h_post)]
        f(*ins).backward()
        grads.append([t.grad.cpu() for t in ins])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
