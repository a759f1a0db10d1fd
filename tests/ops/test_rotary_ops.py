"""Rotary operators against reference math written here from torch_npu's documentation."""
import pytest
import torch

import torch_npu

from ._common import NPU, leaf as _leaf, ops, ref_leaf as _ref_leaf  # noqa: F401


def _rot_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def _rot_interleave(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)


def _rot_quarter(x):
    x1, x2, x3, x4 = x.chunk(4, -1)
    return torch.cat((-x2, x1, -x4, x3), -1)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_with_rotate_matrix(mode):
    """With rotate given, x_new = input @ rotate whatever the mode; rotate gets no gradient."""
    torch.manual_seed(8)
    d = 8
    x, r1, r2 = torch.randn(2, 3, 5, d, dtype=torch.float64), torch.randn(1, 1, 5, d, dtype=torch.float64), \
        torch.randn(1, 1, 5, d, dtype=torch.float64)
    rotate = torch.zeros(d, d, dtype=torch.float64)
    for i in range(0, d, 2):  # the documented example's interleave matrix
        rotate[i, i + 1] = 1
        rotate[i + 1, i] = 1
    ins_n, ins_r = [_leaf(t) for t in (x, r1, r2)], [_ref_leaf(t) for t in (x, r1, r2)]
    out = torch_npu.npu_rotary_mul(*ins_n, mode, rotate.to(NPU))
    xr, c, s = ins_r
    ref = c * xr + s * (xr @ rotate)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, ins_n, g.to(NPU)), torch.autograd.grad(ref, ins_r, g)):
        torch.testing.assert_close(a.cpu(), b)


@pytest.mark.parametrize("layout,mode", [("BSND", "half"), ("TND", "half"), ("SBND", "interleave"),
                                         ("BNSD", "quarter")])
def test_apply_rotary_pos_emb_updates_query_and_key_in_place(layout, mode):
    torch.manual_seed(9)
    d = 8
    shapes = {"BSND": ((2, 5, 4, d), (2, 5, 2, d), (2, 5, 1, d)), "TND": ((6, 4, d), (6, 2, d), (6, 1, d)),
              "SBND": ((5, 2, 4, d), (5, 2, 2, d), (5, 2, 1, d)), "BNSD": ((2, 4, 5, d), (2, 2, 5, d), (2, 1, 5, d))}
    qs, ks, cs = shapes[layout]
    q, k, cos, sin = torch.randn(qs), torch.randn(ks), torch.randn(cs), torch.randn(cs)
    qn, kn = q.to(NPU), k.to(NPU)
    rot = {"half": _rot_half, "interleave": _rot_interleave, "quarter": _rot_quarter}[mode]
    q_out, k_out = torch_npu.npu_apply_rotary_pos_emb(qn, kn, cos.to(NPU), sin.to(NPU), layout=layout,
                                                      rotary_mode=mode)
    assert q_out is qn and k_out is kn
    torch.testing.assert_close(qn.cpu(), q * cos + rot(q) * sin)
    torch.testing.assert_close(kn.cpu(), k * cos + rot(k) * sin)
    with pytest.raises(ValueError, match="rotary_mode"):
        torch_npu.npu_apply_rotary_pos_emb(qn, kn, cos.to(NPU), sin.to(NPU), layout=layout, rotary_mode="third")


def _ref_rope(x, cos, sin, head_size, neox):
    """vLLM-style rope on (T, heads * head_size): the first 2 * cos.shape[-1] dims of each head rotate."""
    h = x.view(x.shape[0], -1, head_size)
    rot = cos.shape[-1] * 2
    xr, xp = h[..., :rot], h[..., rot:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    if neox:
        x1, x2 = xr[..., :rot // 2], xr[..., rot // 2:]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), -1).flatten(-2)
    return torch.cat((out, xp), -1).reshape(x.shape)


@pytest.mark.parametrize("mrope,rotary_mode,cache_mode", [(False, "half", "default"), (False, "interleave", "default"),
                                                          (True, "half", "default"), (True, "half", "interleave")])
def test_mrope(mrope, rotary_mode, cache_mode):
    torch.manual_seed(10)
    t, nq, nk, head, rot, max_len = 5, 2, 1, 16, 12, 9
    section = [2, 2, 2]
    positions = torch.randint(0, max_len, (3, t) if mrope else (t,))
    q, k, cache = torch.randn(t, nq * head), torch.randn(t, nk * head), torch.randn(max_len, rot)
    qo, ko = torch_npu.npu_mrope(positions.to(NPU), q.to(NPU), k.to(NPU), cache.to(NPU), head,
                                 mrope_section=section if mrope else None, rotary_mode=rotary_mode,
                                 cache_mode=cache_mode)
    half = rot // 2
    cos, sin = cache[positions, :half], cache[positions, half:]
    if mrope:  # frequency j of the rot/2 takes its position from axis: sections (default) or j % 3 (interleave)
        if cache_mode == "default":
            axis = [0] * section[0] + [1] * section[1] + [2] * section[2]
        else:
            axis = [j % 3 if j < 3 * section[j % 3] else 0 for j in range(half)]
        cos = torch.stack([cos[axis[j], :, j] for j in range(half)], -1)
        sin = torch.stack([sin[axis[j], :, j] for j in range(half)], -1)
    torch.testing.assert_close(qo.cpu(), _ref_rope(q, cos, sin, head, rotary_mode == "half"))
    torch.testing.assert_close(ko.cpu(), _ref_rope(k, cos, sin, head, rotary_mode == "half"))


def test_rotary_ops_compile():
    x, r1, r2 = torch.randn(2, 3, 5, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
    cos, sin = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8)
    rotate = torch.randn(8, 8)

    def fn(x, q, k):
        y = ops.npu_rotary_mul(x, r1.to(NPU), r2.to(NPU), "half", rotate.to(NPU))
        q, k = ops.npu_apply_rotary_pos_emb(q, k, cos.to(NPU), sin.to(NPU))
        return y, q + k

    outs = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        xn = _leaf(x)
        y, qk = f(xn, torch.ones(2, 3, 4, 8, device=NPU), torch.ones(2, 3, 4, 8, device=NPU))
        y.sum().backward()
        outs.append((y.detach().cpu(), qk.cpu(), xn.grad.cpu()))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b)
