"""Each ``torch.ops.npu`` fused operator against reference math written here (values and gradients)."""
import math

import pytest
import torch
import torch.nn.functional as F

NPU = torch.device("npu:0")
ops = torch.ops.npu


def _leaf(t):
    return t.detach().to(NPU).requires_grad_(True)


def _grads_match(out_npu, out_ref, inputs_npu, inputs_ref, rtol=1e-5, atol=1e-6):
    g = torch.randn_like(out_ref)
    torch.testing.assert_close(out_npu.cpu(), out_ref.detach(), rtol=rtol, atol=atol)
    gn = torch.autograd.grad(out_npu, inputs_npu, g.to(NPU), allow_unused=True, retain_graph=True)
    gr = torch.autograd.grad(out_ref, inputs_ref, g, allow_unused=True, retain_graph=True)
    for a, b in zip(gn, gr):
        torch.testing.assert_close(a.cpu(), b, rtol=rtol, atol=atol)


# ---- attention -----------------------------------------------------------------------------------------
def _ref_attention(q, k, v, scale, mask=None):
    """q (B, N1, Sq, D), k/v (B, N2, Skv, D); mask True = masked; plain softmax(QK^T*scale)V."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def _to_layout(t, layout):  # t is (B, N, S, D)
    return {"BNSD": t, "BSND": t.transpose(1, 2), "BSH": t.transpose(1, 2).flatten(2),
            "SBH": t.permute(2, 0, 1, 3).flatten(2)}[layout].contiguous()


def _from_layout(t, layout, n):  # back to (B, N, S, D)
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    t = t.unflatten(-1, (n, -1))
    return t.transpose(1, 2) if layout == "BSH" else t.permute(1, 2, 0, 3)


TRIU = torch.triu(torch.ones(2048, 2048), 1).bool()


def _band(sq, skv, pre, nxt, shift=0):
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(skv).unsqueeze(0) - shift
    return (j - i > nxt) | (i - j > pre)


@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND", "BNSD"])
@pytest.mark.parametrize("mode", ["none", 0, 1, 2, 3, 4])
def test_fusion_attention_layouts_and_sparse_modes(layout, mode):
    torch.manual_seed(0)
    b, n1, n2, sq, skv, d = 2, 4, 2, 5, 7, 8  # grouped-query heads, Sq != Skv
    q, k, v = torch.randn(b, n1, sq, d), torch.randn(b, n2, skv, d), torch.randn(b, n2, skv, d)
    scale = 1 / math.sqrt(d)
    user_mask = torch.rand(b, 1, sq, skv) < 0.3
    user_mask[..., 0] = False  # every row keeps one key
    kwargs, ref_mask = {}, None
    if mode in (0, 1):
        kwargs = dict(atten_mask=user_mask.to(NPU), sparse_mode=mode)
        ref_mask = user_mask
        if mode == 0:
            kwargs.update(pre_tockens=3, next_tockens=1)
            ref_mask = user_mask | _band(sq, skv, 3, 1)
    elif mode in (2, 3, 4):
        kwargs = dict(atten_mask=TRIU.to(NPU), sparse_mode=mode)
        i, j = torch.arange(sq).unsqueeze(1), torch.arange(skv).unsqueeze(0)
        ref_mask = {2: j > i, 3: j > i + (skv - sq), 4: _band(sq, skv, 2, 0, shift=skv - sq)}[mode]
        if mode == 4:
            kwargs.update(pre_tockens=2, next_tockens=0)
    ql, kl, vl = (_to_layout(t, layout) for t in (q, k, v))
    qn, kn, vn = (_leaf(t) for t in (ql, kl, vl))
    res = ops.npu_fusion_attention(qn, kn, vn, n1, layout, scale=scale, **kwargs)
    assert len(res) == 7 and res[4:] == (0, 0, 0)
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (ql, kl, vl))
    ref = _to_layout(_ref_attention(_from_layout(qr, layout, n1), _from_layout(kr, layout, n2),
                                    _from_layout(vr, layout, n2), scale, ref_mask), layout)
    _grads_match(res[0], ref, (qn, kn, vn), (qr, kr, vr))
    if layout == "BNSD":  # softmax statistics: row max / sum of exp over kept keys, 8 wide
        s = (q.repeat_interleave(1, 1) @ k.repeat_interleave(2, 1).transpose(-1, -2)) * scale
        if ref_mask is not None:
            s = s.masked_fill(ref_mask, float("-inf"))
        smax = s.amax(-1, keepdim=True)
        torch.testing.assert_close(res[1].cpu(), smax.expand(-1, -1, -1, 8))
        torch.testing.assert_close(res[2].cpu(), torch.exp(s - smax).sum(-1, keepdim=True).expand(-1, -1, -1, 8))


@pytest.mark.parametrize("causal", [False, True])
def test_fusion_attention_tnd_varlen(causal):
    torch.manual_seed(1)
    n1, n2, d, lens_q, lens_k = 4, 2, 8, [3, 5, 2], [4, 5, 6]
    tq, tk = sum(lens_q), sum(lens_k)
    q, k, v = torch.randn(tq, n1, d), torch.randn(tk, n2, d), torch.randn(tk, n2, d)
    cq, ck = torch.tensor(lens_q).cumsum(0).tolist(), torch.tensor(lens_k).cumsum(0).tolist()
    kwargs = dict(atten_mask=TRIU.to(NPU), sparse_mode=3) if causal else {}
    qn, kn, vn = _leaf(q), _leaf(k), _leaf(v)
    out = ops.npu_fusion_attention(qn, kn, vn, n1, "TND", scale=0.3, actual_seq_qlen=cq, actual_seq_kvlen=ck,
                                   **kwargs)[0]
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    outs, q0, k0 = [], 0, 0
    for lq, lk in zip(lens_q, lens_k):
        mask = None
        if causal:
            mask = torch.arange(lk).unsqueeze(0) > torch.arange(lq).unsqueeze(1) + (lk - lq)
        o = _ref_attention(qr[q0:q0 + lq].transpose(0, 1)[None], kr[k0:k0 + lk].transpose(0, 1)[None],
                           vr[k0:k0 + lk].transpose(0, 1)[None], 0.3, mask)
        outs.append(o[0].transpose(0, 1))
        q0, k0 = q0 + lq, k0 + lk
    _grads_match(out, torch.cat(outs), (qn, kn, vn), (qr, kr, vr))


def test_fusion_attention_dropout_uses_npu_generator_and_backward_replays_it():
    torch.manual_seed(2)
    b, n, s, d, keep = 1, 2, 6, 4, 0.7
    q, k, v = (torch.randn(b, n, s, d) for _ in range(3))
    qn, kn, vn = _leaf(q), _leaf(k), _leaf(v)
    torch.npu.manual_seed(123)
    out, _, _, _, seed, offset, numel = ops.npu_fusion_attention(qn, kn, vn, n, "BNSD", scale=0.5, keep_prob=keep)
    assert numel == b * n * s * s and seed == 123
    # Reference: the same keep-mask drawn from the npu generator at (seed, offset).
    gen = torch.npu.default_generators[0]
    after = gen.get_state()
    gen.set_state(torch.tensor([seed, offset]).view(torch.uint8))
    keep_mask = (torch.rand(b, n, s, s, device=NPU, generator=gen) < keep).cpu()
    gen.set_state(after)
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    p = torch.softmax(qr @ kr.transpose(-1, -2) * 0.5, -1) * keep_mask / keep
    _grads_match(out, p @ vr, (qn, kn, vn), (qr, kr, vr))
    assert 0 < keep_mask.float().mean() < 1


def test_fusion_attention_library_call_forms():
    """The exact calls of diffusers (BNSD, boolean padding mask, wide band, precision args) and DeepSpeed (BSH)."""
    torch.manual_seed(3)
    b, n, s, d = 2, 2, 5, 4
    q, k, v = (torch.randn(b, n, s, d) for _ in range(3))
    keep_tokens = torch.ones(b, 1, 1, s, dtype=torch.bool)
    keep_tokens[1, ..., -2:] = False  # padding keys of sample 1
    out = ops.npu_fusion_attention(q.to(NPU), k.to(NPU), v.to(NPU), n, atten_mask=(~keep_tokens).expand(b, 1, s, s)
                                   .to(NPU), input_layout="BNSD", pse=None, scale=0.5, pre_tockens=65536,
                                   next_tockens=65536, keep_prob=1.0, sync=False, inner_precise=0)[0]
    torch.testing.assert_close(out.cpu(), _ref_attention(q, k, v, 0.5, ~keep_tokens))
    bsh = [_to_layout(t, "BSH").to(NPU) for t in (q, k, v)]
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    out = ops.npu_fusion_attention(*bsh, n, "BSH", pse=None, padding_mask=None, atten_mask=causal.to(NPU), scale=0.5,
                                   pre_tockens=65536, next_tockens=65536, keep_prob=1, inner_precise=0)[0]
    torch.testing.assert_close(out.cpu(), _to_layout(_ref_attention(q, k, v, 0.5, causal), "BSH"))


def test_fusion_attention_tnd_tokens_past_last_sequence():
    q = torch.randn(6, 2, 4, device=NPU)
    out, smax, ssum, *_ = ops.npu_fusion_attention(q, q, q, 2, "TND", actual_seq_qlen=[2, 4], actual_seq_kvlen=[2, 4])
    assert out.shape == q.shape and smax.shape == ssum.shape == (6, 2, 8)
    assert not out[4:].any() and not ssum[4:].any() and ssum[:4].min() >= 1


def test_fusion_attention_bad_inputs_name_the_problem():
    q = torch.randn(1, 2, 4, 8, device=NPU)
    with pytest.raises(ValueError, match="input_layout"):
        ops.npu_fusion_attention(q, q, q, 2, "NSD")
    with pytest.raises(ValueError, match="compressed 2048x2048"):
        ops.npu_fusion_attention(q, q, q, 2, "BNSD", atten_mask=torch.ones(4, 4, dtype=torch.bool, device=NPU),
                                 sparse_mode=3)
    with pytest.raises(ValueError, match="head_num=3"):
        ops.npu_fusion_attention(q, q, q, 3, "BNSD")
    with pytest.raises(ValueError, match="pse"):
        ops.npu_fusion_attention(q, q, q, 2, "BNSD", pse=q)


# ---- norms, rotary, activations -----------------------------------------------------------------------
@pytest.mark.parametrize("gamma_dims", [1, 2])
def test_rms_norm(gamma_dims):
    x, g = torch.randn(3, 4, 6), torch.randn(*(4, 6)[2 - gamma_dims:])
    xn, gn = _leaf(x), _leaf(g)
    y, rstd = ops.npu_rms_norm(xn, gn, epsilon=1e-5)
    xr, gr = x.clone().requires_grad_(True), g.clone().requires_grad_(True)
    dims = tuple(range(3 - gamma_dims, 3))
    rstd_ref = torch.rsqrt(xr.pow(2).mean(dims, keepdim=True) + 1e-5)
    torch.testing.assert_close(rstd.cpu(), rstd_ref.detach())
    _grads_match(y, xr * rstd_ref * gr, (xn, gn), (xr, gr))


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul(mode):
    x, cos, sin = torch.randn(2, 5, 3, 8), torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    xn, cn, sn = _leaf(x), _leaf(cos), _leaf(sin)
    out = ops.npu_rotary_mul(xn, cn, sn, mode)
    xr, cr, sr = (t.clone().requires_grad_(True) for t in (x, cos, sin))
    if mode == "half":
        rot = torch.cat((-xr[..., 4:], xr[..., :4]), -1)
    else:
        rot = torch.stack((-xr[..., 1::2], xr[..., 0::2]), -1).flatten(-2)
    _grads_match(out, xr * cr + rot * sr, (xn, cn, sn), (xr, cr, sr))


def test_swiglu():
    x = torch.randn(3, 10)
    xn, xr = _leaf(x), x.clone().requires_grad_(True)
    a, b = xr.chunk(2, -1)
    _grads_match(ops.npu_swiglu(xn, dim=-1), F.silu(a) * b, (xn,), (xr,))
    x0 = torch.randn(4, 3)
    xn0, xr0 = _leaf(x0), x0.clone().requires_grad_(True)
    a, b = xr0.chunk(2, 0)
    _grads_match(ops.npu_swiglu(xn0, dim=0), F.silu(a) * b, (xn0,), (xr0,))


@pytest.mark.parametrize("approximate", [0, 1])
def test_geglu(approximate):
    x = torch.randn(2, 3, 8)
    xn, xr = _leaf(x), x.clone().requires_grad_(True)
    out, gelu_out = ops.npu_geglu(xn, dim=-1, approximate=approximate)
    a, b = xr.chunk(2, -1)
    gb = F.gelu(b, approximate="tanh" if approximate else "none")
    torch.testing.assert_close(gelu_out.cpu(), gb.detach())
    # both outputs carry gradient (out and gelu_out)
    g1, g2 = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    dn = torch.autograd.grad((out * g1.to(NPU)).sum() + (gelu_out * g2.to(NPU)).sum(), xn)[0]
    dr = torch.autograd.grad((a * gb * g1).sum() + (gb * g2).sum(), xr)[0]
    torch.testing.assert_close(out.cpu(), (a * gb).detach())
    torch.testing.assert_close(dn.cpu(), dr)


@pytest.mark.parametrize("fixed", [False, True])
def test_scaled_masked_softmax(fixed):
    x = torch.randn(2, 3, 4, 4)
    mask = torch.rand(2, 1, 4, 4) < 0.3
    xn, xr = _leaf(x), x.clone().requires_grad_(True)
    out = ops.npu_scaled_masked_softmax(xn, mask.to(NPU), 0.7, fixed)
    m = torch.ones(4, 4, dtype=torch.bool).triu(1) if fixed else mask
    _grads_match(out, torch.softmax((xr * 0.7).masked_fill(m, -10000.0), -1), (xn,), (xr,))


# ---- optimizer, grouped matmul --------------------------------------------------------------------------
@pytest.mark.parametrize("amsgrad,maximize", [(False, False), (True, True)])
def test_apply_adam_w_deepspeed_call_form(amsgrad, maximize):
    import torch_npu

    p, m, v, grad = torch.randn(10), torch.rand(10), torch.rand(10), torch.randn(10)
    vmax = torch.rand(10)
    lr, wd, b1, b2, eps, step = 0.01, 0.1, 0.9, 0.999, 1e-8, 3
    pn, mn, vn = p.to(NPU), m.to(NPU), v.to(NPU)
    res = torch_npu.npu_apply_adam_w(b1 ** (step - 1), b2 ** (step - 1), lr, wd, b1, b2, eps, grad.to(NPU),
                                     vmax.to(NPU) if amsgrad else None, amsgrad, maximize, out=(pn, mn, vn))
    assert res[0] is pn and res[1] is mn and res[2] is vn
    g = -grad if maximize else grad
    m_ref = b1 * m + (1 - b1) * g
    v_ref = b2 * v + (1 - b2) * g * g
    vhat = torch.maximum(vmax, v_ref) if amsgrad else v_ref
    p_ref = p * (1 - lr * wd) - lr * m_ref / (1 - b1 ** step) / (torch.sqrt(vhat / (1 - b2 ** step)) + eps)
    for a, b in ((pn, p_ref), (mn, m_ref), (vn, v_ref)):
        torch.testing.assert_close(a.cpu(), b)


def test_grouped_matmul_list_form_with_bias():
    xs = [torch.randn(3, 4), torch.randn(5, 4)]
    ws = [torch.randn(4, 6), torch.randn(4, 2)]
    bs = [torch.randn(6), torch.randn(2)]
    xn, wn, bn = [_leaf(t) for t in xs], [_leaf(t) for t in ws], [_leaf(t) for t in bs]
    outs = ops.npu_grouped_matmul(xn, wn, bn)
    xr, wr, br = ([t.clone().requires_grad_(True) for t in ts] for ts in (xs, ws, bs))
    for i in range(2):
        _grads_match(outs[i], xr[i] @ wr[i] + br[i], (xn[i], wn[i], bn[i]), (xr[i], wr[i], br[i]))


@pytest.mark.parametrize("group_list_type,split_item", [(0, 3), (1, 0)])
def test_grouped_matmul_split_m(group_list_type, split_item):
    import torch_npu

    x, w = torch.randn(7, 4), torch.randn(3, 4, 5)  # 3 experts, one (E, K, N) weight
    counts = [2, 0, 5]
    group_list = torch.tensor(counts).cumsum(0) if group_list_type == 0 else torch.tensor(counts)
    xn, wn = _leaf(x), _leaf(w)
    out = torch_npu.npu_grouped_matmul([xn], [wn], group_list=group_list.to(NPU), split_item=split_item,
                                       group_type=0, group_list_type=group_list_type)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    parts = [xr[:2] @ wr[0], xr[2:2] @ wr[1], xr[2:] @ wr[2]]
    if split_item == 3:
        _grads_match(out[0], torch.cat(parts), (xn, wn), (xr, wr))
    else:
        assert [o.shape[0] for o in out] == counts
        _grads_match(out[2], parts[2], (xn, wn), (xr, wr))


def test_ops_need_npu_tensors_and_name_the_op():
    with pytest.raises(NotImplementedError, match="npu::npu_swiglu"):
        ops.npu_swiglu(torch.randn(2, 4))
