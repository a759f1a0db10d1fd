"""npu_fusion_attention_v2 / _v3 (layouts, GQA, masks, rope extension, varlen lengths as lists or tensors,
softmax statistics layout) against per-sequence, per-head reference attention written from the documentation."""
import pytest
import torch

import torch_npu
from tests.ops._common import NPU, leaf, ops, ref_leaf

F64 = torch.float64


def _ref_head(q, k, v, scale, mask):
    """softmax(scale·q kᵀ, masked True) @ v for one (S, D) head; also the row max of the masked scores."""
    s = (q @ k.t()) * scale
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, -1) @ v, s.max(-1).values


def _ref_bsnd(q, k, v, scale, mask=None):
    b, s, n, _ = q.shape
    g = n // k.shape[2]
    out = torch.zeros(b, s, n, v.shape[-1], dtype=q.dtype)
    outs = [[_ref_head(q[i, :, h], k[i, :, h // g], v[i, :, h // g], scale, mask)[0] for h in range(n)]
            for i in range(b)]
    return out + torch.stack([torch.stack(o, 1) for o in outs])


def _check_grads(out, ref, ins, ref_ins, seed=0):
    """Values and gradients; the operator computes scores in float32 (as Ascend), hence the tolerance."""
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-5)
    g = torch.randn(ref.shape, dtype=ref.dtype, generator=torch.Generator().manual_seed(seed))
    got = torch.autograd.grad(out, ins, g.to(NPU))
    want = torch.autograd.grad(ref, ref_ins, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("version", [2, 3])
def test_fusion_attention_v2_v3_bsnd_gqa_band_mask(version):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 5, 4, 8, dtype=F64), torch.randn(2, 5, 2, 8, dtype=F64), torch.randn(2, 5, 2, 8, dtype=F64)
    mask = torch.rand(5, 5) > 0.7
    mask.fill_diagonal_(False)
    ins, refs = [leaf(t) for t in (q, k, v)], [ref_leaf(t) for t in (q, k, v)]
    # sparse_mode 0 with a band: also masked where j - i > 1 (next) or i - j > 2 (pre)
    i, j = torch.arange(5).unsqueeze(1), torch.arange(5).unsqueeze(0)
    full = mask | (j - i > 1) | (i - j > 2)
    if version == 2:
        res = torch_npu.npu_fusion_attention_v2(*ins, 4, "BSND", atten_mask=mask.to(NPU), scale=0.4, pre_tokens=2,
                                                next_tokens=1)
        assert isinstance(res[4], int) and len(res) == 7
    else:
        res = torch_npu.npu_fusion_attention_v3(*ins, 4, "BSND", atten_mask=mask.to(NPU), scale=0.4, pre_tockens=2,
                                                next_tockens=1)
        assert len(res) == 6 and res[4].device.type == "cpu" and res[4].dtype == torch.int64
    assert res[1].shape == (2, 4, 5, 8) and res[1].dtype == torch.float32
    ref = _ref_bsnd(*refs, 0.4, full)
    _check_grads(res[0], ref, ins, refs)
    row_max = torch.stack([torch.stack([_ref_head(q[b, :, h], k[b, :, h // 2], v[b, :, h // 2], 0.4, full)[1]
                                        for h in range(4)]) for b in range(2)])
    torch.testing.assert_close(res[1][..., 0].cpu(), row_max.float())


def _ref_tnd(q, k, v, q_ends, k_ends, scale, causal):
    outs = []
    for q0, q1, k0, k1 in zip([0] + q_ends[:-1], q_ends, [0] + k_ends[:-1], k_ends):
        heads = []
        for h in range(q.shape[1]):
            sq, skv = q1 - q0, k1 - k0
            m = torch.triu(torch.ones(sq, skv, dtype=torch.bool), 1) if causal else None
            heads.append(_ref_head(q[q0:q1, h], k[k0:k1, h], v[k0:k1, h], scale, m)[0])
        outs.append(torch.stack(heads, 1))
    return torch.cat(outs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("softmax_layout", ["", "TND"])
def test_fusion_attention_v2_tnd_rope_extension(softmax_layout):
    torch.manual_seed(1)
    t, n, d, dr = 7, 2, 8, 4
    q, k, v = (torch.randn(t, n, d, dtype=F64) for _ in range(3))
    qr, kr = torch.randn(t, n, dr, dtype=F64), torch.randn(t, n, dr, dtype=F64)
    ins, refs = [leaf(x) for x in (q, k, v, qr, kr)], [ref_leaf(x) for x in (q, k, v, qr, kr)]
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
    out, smax, ssum, *_ = ops.npu_fusion_attention_v2(
        ins[0], ins[1], ins[2], n, "TND", atten_mask=mask.to(NPU), query_rope=ins[3], key_rope=ins[4], scale=0.3,
        actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7], sparse_mode=0, softmax_layout=softmax_layout)
    assert smax.shape == ((n, t, 8) if softmax_layout == "" else (t, n, 8))  # "" is Ascend's NTD default
    # Q Kᵀ + Q_rope K_ropeᵀ: attention over the head dims concatenated
    ref = _ref_tnd(torch.cat(refs[:1] + refs[3:4], -1), torch.cat(refs[1:2] + refs[4:5], -1), refs[2], [3, 7],
                   [3, 7], 0.3, True)
    _check_grads(out, ref, ins, refs, seed=1)


@pytest.mark.timeout(120)
def test_fusion_attention_v3_tnd_tensor_lengths_and_causal_mode():
    torch.manual_seed(2)
    q, k, v = (torch.randn(6, 2, 4, dtype=F64) for _ in range(3))
    ins, refs = [leaf(x) for x in (q, k, v)], [ref_leaf(x) for x in (q, k, v)]
    compressed = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    lens = torch.tensor([2, 6], dtype=torch.int64)
    out, smax, *_ = torch_npu.npu_fusion_attention_v3(*ins, 2, "TND", atten_mask=compressed.to(NPU), scale=0.5,
                                                      actual_seq_qlen=lens, actual_seq_kvlen=lens, sparse_mode=2,
                                                      softmax_layout="TND")
    assert smax.shape == (6, 2, 8)
    _check_grads(out, _ref_tnd(*refs, [2, 6], [2, 6], 0.5, True), ins, refs, seed=2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("version,layout,sparse_mode", [(2, "BSND", 2), (3, "BSH", 0), (2, "BNSD", 3)])
def test_fusion_attention_sink(version, layout, sparse_mode):
    """A per-head sink logit joins every row's softmax: out = Σ e^(s-m) v / (Σ e^(s-m) + e^(sink-m))."""
    torch.manual_seed(3)
    b, s, n, nkv, d = 2, 5, 4, 2, 8
    q, k, v = torch.randn(b, s, n, d, dtype=F64), torch.randn(b, s, nkv, d, dtype=F64), torch.randn(b, s, nkv, d,
                                                                                                  dtype=F64)
    sink = torch.randn(n, dtype=F64)
    i, j = torch.arange(s).unsqueeze(1), torch.arange(s).unsqueeze(0)
    if sparse_mode == 0:
        mask = torch.rand(s, s) > 0.6
        mask.fill_diagonal_(False)
        given, full = mask, mask
    else:  # the compressed mask; 2: top-left causal, 3: bottom-right causal (equal lengths: the same)
        given, full = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1), j > i
    ins, refs = [leaf(t) for t in (q, k, v, sink)], [ref_leaf(t) for t in (q, k, v, sink)]
    to_layout = {"BSND": lambda t: t, "BSH": lambda t: t.flatten(2), "BNSD": lambda t: t.transpose(1, 2)}[layout]
    qn, kn, vn = (to_layout(t) for t in ins[:3])
    fn = torch_npu.npu_fusion_attention_v2 if version == 2 else torch_npu.npu_fusion_attention_v3
    res = fn(qn, kn, vn, n, layout, atten_mask=given.to(NPU), scale=0.3, sparse_mode=sparse_mode, sink=ins[3])
    heads = []
    for bb in range(b):
        per = []
        for h in range(n):
            sc = (refs[0][bb, :, h] @ refs[1][bb, :, h // 2].t()) * 0.3
            sc = torch.cat([sc.masked_fill(full, float("-inf")), refs[3][h].expand(s, 1)], -1)
            per.append(torch.softmax(sc, -1)[:, :-1] @ refs[2][bb, :, h // 2])
        heads.append(torch.stack(per, 1))
    ref = to_layout(torch.stack(heads))
    _check_grads(res[0], ref, ins, refs, seed=3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call,match", [
    (lambda q: ops.npu_fusion_attention_v2(q, q, q, 2, "BNSD", sink=torch.zeros(3, device=NPU)),
     "npu_fusion_attention_v2: sink must be"),
    (lambda q: ops.npu_fusion_attention_v3(q[0], q[0], q[0], 2, "TND", sink=torch.zeros(2, device=NPU),
                                           actual_seq_qlen=torch.tensor([2]), actual_seq_kvlen=torch.tensor([2])),
     "npu_fusion_attention_v3: sink with input_layout 'TND'"),
    (lambda q: ops.npu_fusion_attention_v2(q, q, q, 2, "BNSD", pse_type=2), "pse_type"),
    (lambda q: ops.npu_fusion_attention_v2(q, q, q, 2, "BNSD", softmax_layout="TND"), "softmax_layout"),
    (lambda q: ops.npu_fusion_attention_v2(q, q, q, 2, "BNSD", query_rope=q), "key_rope"),
    (lambda q: ops.npu_fusion_attention_v2(q, q, q, 3, "BNSD"), "npu_fusion_attention_v2: head_num"),
    (lambda q: ops.npu_fusion_attention_v3(q, q, q, 2, "BNSD", pse=q), "npu_fusion_attention_v3: pse"),
    (lambda q: ops.npu_fusion_attention_v3(q, q, q, 2, "BNSD", keep_prob=0.0), "npu_fusion_attention_v3: keep_prob"),
])
def test_fusion_attention_v2_v3_invalid_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(1, 2, 3, 4, device=NPU))


@pytest.mark.timeout(300)
def test_fusion_attention_v2_v3_compile_fullgraph():
    def fn(q, k, v):
        a = torch_npu.npu_fusion_attention_v2(q, k, v, 2, "BNSD", scale=0.5)[0]
        b = torch_npu.npu_fusion_attention_v3(q, k, v, 2, "BNSD", scale=0.5, next_tockens=0,
                                              atten_mask=torch.ones(3, 3, dtype=torch.bool, device=q.device).triu(1))[0]
        c = torch_npu.npu_fusion_attention_v2(q, k, v, 2, "BNSD", scale=0.5, sink=q[0, :, 0, 0])[0]
        return (a + b + c).sum()

    base = [torch.randn(1, 2, 3, 4) for _ in range(3)]
    ce, ee = [leaf(t) for t in base], [leaf(t) for t in base]
    lc = torch.compile(fn, fullgraph=True, backend="aot_eager")(*ce)
    le = fn(*ee)
    torch.testing.assert_close(lc.detach().cpu(), le.detach().cpu())
    lc.backward()
    le.backward()
    for a, b in zip(ce, ee):
        torch.testing.assert_close(a.grad.cpu(), b.grad.cpu())


@pytest.mark.timeout(300)
def test_fusion_attention_v2_rope_compile_fullgraph():
    """The rope extension makes the query/key head dim larger than value's: the traced output keeps value's."""
    def fn(q, k, v, qr, kr, mask):
        return torch_npu.npu_fusion_attention_v2(q, k, v, 2, "TND", atten_mask=mask, query_rope=qr, key_rope=kr,
                                                 actual_seq_qlen=[2, 5], actual_seq_kvlen=[2, 5], scale=0.4)[0]

    base = [torch.randn(5, 2, 4) for _ in range(3)] + [torch.randn(5, 2, 2) for _ in range(2)]
    mask = torch.triu(torch.ones(3, 3, dtype=torch.bool), 1).to(NPU)
    ce, ee = [leaf(t) for t in base], [leaf(t) for t in base]
    oc = torch.compile(fn, fullgraph=True, backend="aot_eager")(*ce, mask)
    oe = fn(*ee, mask)
    assert oc.shape == (5, 2, 4)
    torch.testing.assert_close(oc.detach().cpu(), oe.detach().cpu())
    oc.pow(2).sum().backward()
    oe.pow(2).sum().backward()
    for a, b in zip(ce, ee):
        torch.testing.assert_close(a.grad.cpu(), b.grad.cpu())
