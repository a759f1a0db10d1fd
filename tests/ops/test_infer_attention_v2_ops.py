"""npu_fused_infer_attention_score_v2 against a per-(item, head, query row) loop of the documented formula
softmax(softmax_scale * q.k + pse, masked) . v, with the learnable sink's logit in each row's softmax denominator."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops

TOL = dict(atol=1e-5, rtol=1e-5)


def _ref(q, k, v, scale, allowed, sink=None):
    """q (B, N, Sq, D), k/v (B, Nkv, Skv, D) -> (out (B, N, Sq, D), lse (B, N, Sq, 1)); a row with no allowed key
    gives 0 and lse -inf."""
    bsz, heads, sq, d = q.shape
    groups = heads // k.shape[1]
    out = torch.zeros(bsz, heads, sq, d, dtype=torch.float64)
    lse = torch.full((bsz, heads, sq, 1), float("-inf"), dtype=torch.float64)
    for b in range(bsz):
        for n in range(heads):
            for i in range(sq):
                keys = [j for j in range(k.shape[2]) if allowed(b, n, i, j)]
                if not keys:
                    continue
                s = [scale * float(q[b, n, i] @ k[b, n // groups, j]) for j in keys]
                top = max(s)
                total = sum(math.exp(x - top) for x in s)
                lse[b, n, i, 0] = top + math.log(total)
                denom = total + (0.0 if sink is None else math.exp(float(sink[n]) - top))
                for x, j in zip(s, keys):
                    out[b, n, i] += math.exp(x - top) / denom * v[b, n // groups, j]
    return out, lse


def _rand(*shape, seed):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _bsh(t):  # (B, N, S, D) -> (B, S, N * D)
    return t.transpose(1, 2).flatten(-2)


@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD", "BNSD_BSND"])
@pytest.mark.parametrize("with_sink", [False, True])
def test_v2_prompt_branch(layout, with_sink):
    q, k, v = _rand(2, 4, 3, 8, seed=1), _rand(2, 2, 5, 8, seed=2), _rand(2, 2, 5, 8, seed=3)
    sink = _rand(4, seed=4) if with_sink else None
    kv_lens = [5, 4]
    inputs = {"BSH": _bsh, "BSND": lambda t: t.transpose(1, 2), "BNSD": lambda t: t, "BNSD_BSND": lambda t: t}[layout]
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(
        inputs(q).to(NPU), inputs(k).to(NPU), inputs(v).to(NPU), actual_seq_kvlen=kv_lens,
        learnable_sink=None if sink is None else sink.to(NPU), num_query_heads=4, num_key_value_heads=2,
        softmax_scale=0.3, next_tokens=0, input_layout=layout, return_softmax_lse=True)

    def rule(b, n, i, j):  # sparse mode 0 without a mask ignores next_tokens (documented)
        return j < kv_lens[b]

    ref, ref_lse = _ref(q, k, v, 0.3, rule, sink)
    want = {"BSH": _bsh, "BSND": lambda t: t.transpose(1, 2), "BNSD": lambda t: t,
            "BNSD_BSND": lambda t: t.transpose(1, 2)}[layout](ref)
    torch.testing.assert_close(out.cpu(), want, **TOL)
    torch.testing.assert_close(lse.cpu(), ref_lse.float(), **TOL)


def test_v2_mask_sparse_mode_and_sink():
    q, k, v = _rand(1, 2, 4, 8, seed=5), _rand(1, 2, 6, 8, seed=6), _rand(1, 2, 6, 8, seed=7)
    mask = torch.rand(1, 1, 4, 6, generator=torch.Generator().manual_seed(8)) > 0.6
    mask[..., 0, :] = True  # the first query row sees no key: 0, whatever the sink
    sink = _rand(2, seed=9)
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(
        q.to(NPU), k.to(NPU), v.to(NPU), atten_mask=mask.to(NPU), learnable_sink=sink.to(NPU), num_query_heads=2,
        softmax_scale=0.5, input_layout="BNSD", sparse_mode=1, return_softmax_lse=True, inner_precise=2)
    ref, ref_lse = _ref(q, k, v, 0.5, lambda b, n, i, j: not mask[b, 0, i, j], sink)
    torch.testing.assert_close(out.cpu(), ref, **TOL)
    torch.testing.assert_close(lse.cpu(), ref_lse.float(), **TOL)
    assert out.cpu()[0, :, 0].abs().sum() == 0


def test_v2_incremental_branch_with_sink():
    q, k, v = _rand(2, 2, 1, 8, seed=10), _rand(2, 2, 6, 8, seed=11), _rand(2, 2, 6, 8, seed=12)
    sink, lens = _rand(2, seed=13), [6, 3]
    out, none = torch_npu.npu_fused_infer_attention_score_v2(
        _bsh(q).to(NPU), _bsh(k).to(NPU), _bsh(v).to(NPU), actual_seq_kvlen=lens, learnable_sink=sink.to(NPU),
        num_query_heads=2, softmax_scale=0.5)
    ref, _ = _ref(q, k, v, 0.5, lambda b, n, i, j: j < lens[b], sink)
    torch.testing.assert_close(out.cpu(), _bsh(ref), **TOL)
    assert none.shape == (1,) and none.item() == 0


def test_v2_rejects_unsupported_arguments():
    q = torch.randn(1, 2, 16).to(NPU)
    for kw, word in ((dict(dequant_scale_query=torch.ones(1).to(NPU)), "dequant_scale_query"),
                     (dict(query_rope=q), "query_rope"), (dict(out_dtype=1), "out_dtype"),
                     (dict(input_layout="TND"), "input_layout"), (dict(inner_precise=4), "inner_precise"),
                     (dict(learnable_sink=torch.ones(3).to(NPU)), "learnable_sink")):
        with pytest.raises(ValueError, match=f"npu_fused_infer_attention_score_v2: {word}"):
            torch_npu.npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=2, **kw)


def test_v2_compile():
    def fn(q, k, v, sink):
        return ops.npu_fused_infer_attention_score_v2(q, k, v, learnable_sink=sink, num_query_heads=2,
                                                      softmax_scale=0.5, return_softmax_lse=True)

    g = torch.Generator().manual_seed(14)
    args = [torch.randn(2, 3, 16, generator=g).to(NPU), torch.randn(2, 4, 16, generator=g).to(NPU),
            torch.randn(2, 4, 16, generator=g).to(NPU), torch.randn(2, generator=g).to(NPU)]
    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
