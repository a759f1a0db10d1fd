"""Cross-entropy, Adam, the attention merges and the layout operators against reference math written here from
torch_npu's documentation."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_npu

from ._common import NPU, leaf as _leaf, ops, ref_leaf as _ref_leaf  # noqa: F401


# ---- cross entropy ------------------------------------------------------------------------------------------
def _ref_ce(x, t, w, reduction, ignore, eps):
    """torch's CrossEntropyLoss written out: nll and smoothing terms with class weights and ignored rows."""
    lp = x - x.logsumexp(1, keepdim=True)
    n, c = x.shape
    keep = (t != ignore).to(x.dtype)
    tt = torch.where(t != ignore, t, 0)
    ww = w if w is not None else torch.ones(c, dtype=x.dtype)
    wt = ww[tt] * keep
    nll = -lp[torch.arange(n), tt] * wt
    smooth = -(lp * ww).sum(1) * keep
    if reduction == "none":
        return (1 - eps) * nll + eps / c * smooth, lp
    if reduction == "sum":
        return ((1 - eps) * nll.sum() + eps / c * smooth.sum()).reshape(1), lp
    return (((1 - eps) * nll.sum() + eps / c * smooth.sum()) / wt.sum()).reshape(1), lp  # kept rows' weight


@pytest.mark.parametrize("reduction,weighted,ignore,eps", [("mean", False, -100, 0.0), ("mean", True, 2, 0.1),
                                                           ("sum", True, -100, 0.2), ("none", False, 1, 0.1),
                                                           ("mean", False, 0, 0.3)])
def test_cross_entropy_loss(reduction, weighted, ignore, eps):
    torch.manual_seed(11)
    x = torch.randn(6, 5, dtype=torch.float64)
    t = torch.tensor([0, 1, 2, 3, 4, 2])
    w = torch.rand(5, dtype=torch.float64) + 0.1 if weighted else None
    xn, xr = _leaf(x), _ref_leaf(x)
    loss, lp, zloss, lse = torch_npu.npu_cross_entropy_loss(xn, t.to(NPU), None if w is None else w.to(NPU),
                                                            reduction, ignore, eps)
    ref, ref_lp = _ref_ce(xr, t, w, reduction, ignore, eps)
    assert loss.shape == ((6,) if reduction == "none" else (1,)) and zloss.numel() == lse.numel() == 0
    torch.testing.assert_close(lp.detach().cpu(), ref_lp.detach())
    torch.testing.assert_close(loss.detach().cpu(), ref.detach())
    g = torch.randn(ref.shape, dtype=ref.dtype)
    torch.testing.assert_close(torch.autograd.grad(loss, xn, g.to(NPU))[0].cpu(), torch.autograd.grad(ref, xr, g)[0])
    if reduction == "mean":  # the documented equivalent: torch's cross entropy
        torch.testing.assert_close(loss.detach().cpu()[0], F.cross_entropy(x, t, w, ignore_index=ignore,
                                                                             label_smoothing=eps))
    with pytest.raises(ValueError, match="z-loss"):
        torch_npu.npu_cross_entropy_loss(xn, t.to(NPU), return_zloss=True)


# ---- Adam -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nesterov", [False, True])
def test_apply_adam_tensorflow_form(nesterov):
    torch.manual_seed(12)
    var, m, v, g = torch.randn(7), torch.randn(7), torch.rand(7), torch.randn(7)
    lr, b1, b2, eps, step = 0.01, 0.9, 0.99, 1e-7, 4
    vn, mn, wn = var.to(NPU), m.to(NPU), v.to(NPU)
    res = torch_npu.npu_apply_adam(b1 ** step, b2 ** step, lr, b1, b2, eps, g.to(NPU), False, nesterov,
                                   out=(vn, mn, wn))
    assert res[0] is vn and res[1] is mn and res[2] is wn
    lr_t = lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
    m_ref = m + (1 - b1) * (g - m)
    v_ref = v + (1 - b2) * (g * g - v)
    upd = (b1 * m_ref + (1 - b1) * g) if nesterov else m_ref
    for a, b in ((vn, var - lr_t * upd / (v_ref.sqrt() + eps)), (mn, m_ref), (wn, v_ref)):
        torch.testing.assert_close(a.cpu(), b)
    out = ops.npu_apply_adam.out(b1, b2, lr, b1, b2, eps, g.to(NPU), None, None, var=vn, m=mn, v=wn)
    assert out[0] is vn


# ---- attention merges ----------------------------------------------------------------------------------------
def _attn_stats(q, k, v):
    """One FlashAttention block: out, row max and row sum of exp(s - max) (plain math)."""
    s = q @ k.transpose(-1, -2)
    m = s.max(-1, keepdim=True).values
    e = torch.exp(s - m)
    return (e / e.sum(-1, keepdim=True)) @ v, m.squeeze(-1), e.sum(-1)


@pytest.mark.parametrize("layout", ["SBH", "TND"])
def test_ring_attention_update_merges_two_kv_blocks_into_full_attention(layout):
    torch.manual_seed(13)
    b, n, s, d = 2, 2, 3, 4
    q, k1, v1, k2, v2 = (torch.randn(b, n, s, d) for _ in range(5))
    o1, m1, s1 = _attn_stats(q, k1, v1)
    o2, m2, s2 = _attn_stats(q, k2, v2)
    full = torch.softmax(q @ torch.cat((k1, k2), 2).transpose(-1, -2), -1) @ torch.cat((v1, v2), 2)
    if layout == "SBH":
        to_out = lambda o: o.permute(2, 0, 1, 3).flatten(2)  # noqa: E731  (B, N, S, D) -> (S, B, H)
        to_stat = lambda t: t.unsqueeze(-1).repeat(1, 1, 1, 8)  # noqa: E731  (B, N, S, 8)
        kw = {}
    else:
        to_out = lambda o: o[0].transpose(0, 1)  # noqa: E731  batch 0 as T = S tokens: (T, N, D)
        to_stat = lambda t: t[0].transpose(0, 1).unsqueeze(-1).repeat(1, 1, 8)  # noqa: E731
        full = full[:1]
        kw = {"actual_seq_qlen": torch.tensor([s]).to(NPU), "input_layout": "TND"}
    out, m, ssum = torch_npu.npu_ring_attention_update(
        *(t.to(NPU) for t in (to_out(o1), to_stat(m1), to_stat(s1), to_out(o2), to_stat(m2), to_stat(s2))), **kw)
    torch.testing.assert_close(out.cpu(), to_out(full))
    torch.testing.assert_close(m.cpu(), to_stat(torch.maximum(m1, m2)))
    mm = torch.maximum(m1, m2)
    torch.testing.assert_close(ssum.cpu(), to_stat(s1 * torch.exp(m1 - mm) + s2 * torch.exp(m2 - mm)))


def test_attention_update_combines_sp_partials_by_lse():
    torch.manual_seed(14)
    n, d, sp = 5, 4, 3
    lse, outs = [torch.randn(n) for _ in range(sp)], [torch.randn(n, d) for _ in range(sp)]
    out, lse_out = torch_npu.npu_attention_update([t.to(NPU) for t in lse], [t.to(NPU) for t in outs], 1)
    ref_lse = torch.log(sum(torch.exp(t) for t in lse))
    torch.testing.assert_close(lse_out.cpu(), ref_lse)
    torch.testing.assert_close(out.cpu(), sum(o * torch.exp(l_ - ref_lse).unsqueeze(-1) for o, l_ in zip(outs, lse)))


# ---- layout ---------------------------------------------------------------------------------------------------
def test_layout_operators_match_the_documented_examples():
    a = torch.tensor([5, 3, 2, 1], dtype=torch.int32)
    assert torch_npu.npu_one_hot(a.to(NPU), depth=5).cpu().tolist() == [
        [0, 0, 0, 0, 0], [0, 0, 0, 1, 0], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0]]
    oh = torch_npu.npu_one_hot(torch.tensor([[1, 0]]).to(NPU), 0, 3, 5, -1)  # class axis first, custom values
    assert oh.shape == (3, 1, 2) and oh.cpu()[:, 0, 0].tolist() == [-1, 5, -1]
    x = torch.tensor([[20, 20, 10, 10]], dtype=torch.float16)
    assert torch_npu.npu_pad(x.to(NPU), [1, 1, 1, 1]).cpu().tolist() == [
        [0, 0, 0, 0, 0, 0], [0, 20, 20, 10, 10, 0], [0, 0, 0, 0, 0, 0]]
    assert torch_npu.npu_pad(torch.ones(1, 2).to(NPU), [0, 2, 1, 0]).shape == (3, 3)  # dim 0 (0, 2), dim 1 (1, 0)
    assert torch_npu.npu_broadcast(torch.tensor([[1], [2], [3]]).to(NPU), [2, 3, 4]).cpu().tolist() == [
        [[1] * 4, [2] * 4, [3] * 4]] * 2
    y = torch.rand(2, 3, 4, 6)
    assert torch_npu.npu_transpose(y[0].to(NPU), (2, 0, 1)).shape == (6, 3, 4)
    assert torch_npu.npu_transpose(y.to(NPU), (2, 0, 1, 3)).is_contiguous()
    torch.testing.assert_close(torch_npu.npu_confusion_transpose(y.to(NPU), (0, 2, 1, 3), (2, 4, 18), True).cpu(),
                               y.permute(0, 2, 1, 3).reshape(2, 4, 18))
    torch.testing.assert_close(torch_npu.npu_confusion_transpose(y.to(NPU), (0, 2, 1), (2, 12, 6), False).cpu(),
                               y.reshape(2, 12, 6).permute(0, 2, 1))
    c = torch_npu.npu_dtype_cast(torch.tensor([0, 0.5, -1.]).to(NPU), dtype=torch.int)
    assert c.dtype == torch.int32 and c.cpu().tolist() == [0, 0, -1]
    with pytest.raises(ValueError, match="input_dtype"):
        torch_npu.npu_dtype_cast(torch.ones(2).to(NPU), torch.half, torch.bfloat16)


def test_layout_operators_backward_and_compile():
    x = torch.randn(2, 3, 4, dtype=torch.float64)

    def fn(x):
        y = ops.npu_confusion_transpose(ops.npu_pad(x, [0, 1, 1, 0, 0, 0]), (1, 0, 2), (4, 6, 2), False)
        y = ops.npu_broadcast(ops.npu_transpose(y, (2, 1, 0)), [3, 2, 4, 6])
        return ops.npu_dtype_cast(y, torch.float32).sum() + ops.npu_cross_entropy_loss(
            x.reshape(6, 4).float(), torch.tensor([0, 1, 2, 3, 0, 1], device=x.device))[0].sum()

    def ref(x):
        y = F.pad(x, [0, 0, 1, 0, 0, 1]).reshape(4, 6, 2).permute(1, 0, 2)
        y = y.permute(2, 1, 0).expand(3, 2, 4, 6)
        return y.float().sum() + F.cross_entropy(x.reshape(6, 4).float(), torch.tensor([0, 1, 2, 3, 0, 1]))

    xr = _ref_leaf(x)
    gr = torch.autograd.grad(ref(xr), xr)[0]
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        xn = _leaf(x)
        torch.testing.assert_close(torch.autograd.grad(f(xn), xn)[0].cpu(), gr)
