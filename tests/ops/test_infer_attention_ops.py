"""torch_npu's inference attention operators against a per-(item, head, query row) loop written here from the
documented formula softmax(scale * q.k + pse, masked) . v, with the allowed keys spelled out per case."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops

TOL = dict(atol=1e-5, rtol=1e-5)


def _ref(q, k, v, scale, allowed, pse=None, q_lens=None):
    """q (B, N, Sq, D), k/v (B, Nkv, Skv, D); allowed(b, n, i, j) -> bool; rows past q_lens[b] and rows with no
    allowed key are 0."""
    bsz, heads, sq, d = q.shape
    groups = heads // k.shape[1]
    out = torch.zeros(bsz, heads, sq, d, dtype=torch.float64)
    for b in range(bsz):
        for n in range(heads):
            for i in range(sq if q_lens is None else q_lens[b]):
                keys = [j for j in range(k.shape[2]) if allowed(b, n, i, j)]
                if not keys:
                    continue
                s = [scale * float(q[b, n, i] @ k[b, n // groups, j]) + (0.0 if pse is None else float(pse(b, n, i, j)))
                     for j in keys]
                top = max(s)
                e = [math.exp(x - top) for x in s]
                for w, j in zip(e, keys):
                    out[b, n, i] += w / sum(e) * v[b, n // groups, j]
    return out


def _rand(*shape, seed):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _bsh(t):  # (B, N, S, D) -> (B, S, N * D)
    return t.transpose(1, 2).flatten(-2)


def test_prompt_bsh_gqa_without_mask():
    q, k, v = _rand(2, 4, 3, 8, seed=0), _rand(2, 2, 5, 8, seed=1), _rand(2, 2, 5, 8, seed=2)
    out = torch_npu.npu_prompt_flash_attention(_bsh(q).to(NPU), _bsh(k).to(NPU), _bsh(v).to(NPU), num_heads=4,
                                               num_key_value_heads=2, scale_value=0.3)
    ref = _ref(q, k, v, 0.3, lambda b, n, i, j: True)
    torch.testing.assert_close(out.cpu(), _bsh(ref), **TOL)


def test_prompt_mask_band_lengths_and_pse():
    q, k, v = _rand(2, 2, 4, 8, seed=3), _rand(2, 2, 6, 8, seed=4), _rand(2, 2, 6, 8, seed=5)
    mask = torch.rand(2, 1, 4, 6, generator=torch.Generator().manual_seed(6)) > 0.7
    pse = _rand(1, 2, 4, 6, seed=7)
    q_lens, kv_lens = [3, 4], [6, 5]
    out = torch_npu.npu_prompt_flash_attention(
        q.to(NPU), k.to(NPU), v.to(NPU), atten_mask=mask.to(NPU), pse_shift=pse.to(NPU), actual_seq_lengths=q_lens,
        actual_seq_lengths_kv=kv_lens, num_heads=2, scale_value=0.5, pre_tokens=2, next_tokens=1, input_layout="BNSD")
    ref = _ref(q, k, v, 0.5, lambda b, n, i, j: j < kv_lens[b] and not mask[b, 0, i, j] and -2 <= j - i <= 1,
               pse=lambda b, n, i, j: pse[0, n, i, j], q_lens=q_lens)
    torch.testing.assert_close(out.cpu(), ref, **TOL)
    # sparse_mode 1: the mask alone, the band ignored; BNSD in, BSND out
    out = torch_npu.npu_prompt_flash_attention(q.to(NPU), k.to(NPU), v.to(NPU), atten_mask=mask[0, 0].to(NPU),
                                               num_heads=2, scale_value=0.5, next_tokens=0, sparse_mode=1,
                                               input_layout="BNSD_BSND")
    ref = _ref(q, k, v, 0.5, lambda b, n, i, j: not mask[0, 0, i, j])
    torch.testing.assert_close(out.cpu(), ref.transpose(1, 2), **TOL)


@pytest.mark.parametrize("mode", [2, 3, 4])
def test_prompt_compressed_causal_and_band_modes(mode):
    q, k, v = _rand(1, 2, 3, 8, seed=8), _rand(1, 2, 5, 8, seed=9), _rand(1, 2, 5, 8, seed=10)
    compressed = torch.triu(torch.ones(2048, 2048), 1).bool()
    out = torch_npu.npu_prompt_flash_attention(q.transpose(1, 2).to(NPU), k.transpose(1, 2).to(NPU),
                                               v.transpose(1, 2).to(NPU), atten_mask=compressed.to(NPU), num_heads=2,
                                               scale_value=0.4, pre_tokens=1, next_tokens=0, input_layout="BSND",
                                               sparse_mode=mode)
    shift = 5 - 3
    rule = {2: lambda i, j: j <= i, 3: lambda i, j: j <= i + shift,
            4: lambda i, j: -1 <= j - shift - i <= 0}[mode]
    ref = _ref(q, k, v, 0.4, lambda b, n, i, j: rule(i, j))
    torch.testing.assert_close(out.cpu(), ref.transpose(1, 2), **TOL)


def test_prompt_rejects():
    q = torch.randn(1, 2, 16, device=NPU)
    with pytest.raises(ValueError, match="npu_prompt_flash_attention: deq_scale1"):
        torch_npu.npu_prompt_flash_attention(q, q, q, num_heads=2, deq_scale1=torch.ones(1, device=NPU))
    with pytest.raises(ValueError, match="npu_prompt_flash_attention: sparse_mode"):
        torch_npu.npu_prompt_flash_attention(q, q, q, num_heads=2, sparse_mode=6)
    with pytest.raises(ValueError, match="npu_prompt_flash_attention: input_layout"):
        torch_npu.npu_prompt_flash_attention(q, q, q, num_heads=2, input_layout="TND")


def test_incre_mask_pse_lengths_gqa():
    q, k, v = _rand(2, 4, 1, 8, seed=11), _rand(2, 2, 6, 8, seed=12), _rand(2, 2, 6, 8, seed=13)
    mask = torch.rand(2, 1, 1, 6, generator=torch.Generator().manual_seed(14)) > 0.7
    mask[0, 0, 0, 0] = False
    pse = _rand(2, 4, 1, 6, seed=15)
    lens = [4, 6]
    out = torch_npu.npu_incre_flash_attention(_bsh(q).to(NPU), _bsh(k).to(NPU), _bsh(v).to(NPU),
                                              atten_mask=mask.to(NPU), pse_shift=pse.to(NPU), actual_seq_lengths=lens,
                                              num_heads=4, num_key_value_heads=2, scale_value=1 / math.sqrt(8))
    ref = _ref(q, k, v, 1 / math.sqrt(8), lambda b, n, i, j: j < lens[b] and not mask[b, 0, 0, j],
               pse=lambda b, n, i, j: pse[b, n, 0, j])
    torch.testing.assert_close(out.cpu(), _bsh(ref), **TOL)


def test_incre_left_padding():
    q, k, v = _rand(3, 2, 1, 8, seed=16), _rand(3, 2, 6, 8, seed=17), _rand(3, 2, 6, 8, seed=18)
    lens, pad = [3, 2, 6], 1  # item 2: start 6 - 1 - 6 < 0 gives zeros (documented)
    out = torch_npu.npu_incre_flash_attention(q.to(NPU), k.to(NPU), v.to(NPU), actual_seq_lengths=lens,
                                              kv_padding_size=torch.tensor([pad], device=NPU), num_heads=2,
                                              scale_value=0.5, input_layout="BNSD")
    ref = _ref(q, k, v, 0.5, lambda b, n, i, j: 6 - pad - lens[b] <= j < 6 - pad)
    ref[2] = 0
    torch.testing.assert_close(out.cpu(), ref, **TOL)


@pytest.mark.parametrize("pool_layout", ["BSH", "BNSD"])
def test_incre_page_attention(pool_layout):
    heads, d, bs, nblocks = 2, 8, 4, 6
    q = _rand(2, heads, 1, d, seed=19)
    kpool, vpool = _rand(nblocks, heads, bs, d, seed=20), _rand(nblocks, heads, bs, d, seed=21)
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    lens = [6, 9]
    # item b's token t lives in block table[b, t // bs] at offset t % bs
    k = torch.stack([torch.stack([kpool[table[b, t // bs], :, t % bs] for t in range(12)], 1) for b in range(2)])
    v = torch.stack([torch.stack([vpool[table[b, t // bs], :, t % bs] for t in range(12)], 1) for b in range(2)])
    if pool_layout == "BSH":
        kp, vp, qi, layout = kpool.transpose(1, 2).flatten(-2), vpool.transpose(1, 2).flatten(-2), _bsh(q), "BSH"
    else:
        kp, vp, qi, layout = kpool, vpool, q, "BNSD"
    out = torch_npu.npu_incre_flash_attention(qi.to(NPU), kp.to(NPU), vp.to(NPU), block_table=table.to(NPU),
                                              actual_seq_lengths=lens, num_heads=heads, scale_value=0.3,
                                              input_layout=layout, block_size=bs)
    ref = _ref(q, k, v, 0.3, lambda b, n, i, j: j < lens[b])
    torch.testing.assert_close(out.cpu(), _bsh(ref) if layout == "BSH" else ref, **TOL)
    with pytest.raises(ValueError, match="npu_incre_flash_attention: page attention"):
        torch_npu.npu_incre_flash_attention(qi.to(NPU), kp.to(NPU), vp.to(NPU), block_table=table.to(NPU),
                                            num_heads=heads, input_layout=layout, block_size=bs)


def test_incre_rejects():
    q = torch.randn(1, 1, 16, device=NPU)
    with pytest.raises(ValueError, match="npu_incre_flash_attention: antiquant_scale"):
        torch_npu.npu_incre_flash_attention(q, q, q, num_heads=2, antiquant_scale=torch.ones(2, 16, device=NPU))
    with pytest.raises(ValueError, match="npu_incre_flash_attention: num_heads"):
        torch_npu.npu_incre_flash_attention(q, q, q, num_heads=4, num_key_value_heads=3)


def _ref_lse(q, k, scale, allowed):
    """log(sum(exp(s))) per (item, head, row) of the allowed scaled scores, -inf for none, as (B, N, Sq, 1)."""
    bsz, heads, sq, _ = q.shape
    groups = heads // k.shape[1]
    out = torch.full((bsz, heads, sq, 1), float("-inf"))
    for b in range(bsz):
        for n in range(heads):
            for i in range(sq):
                s = [scale * float(q[b, n, i] @ k[b, n // groups, j]) for j in range(k.shape[2]) if allowed(b, n, i, j)]
                if s:
                    out[b, n, i, 0] = max(s) + math.log(sum(math.exp(x - max(s)) for x in s))
    return out


def test_fused_infer_prompt_branch_with_lse():
    q, k, v = _rand(2, 4, 3, 8, seed=22), _rand(2, 2, 5, 8, seed=23), _rand(2, 2, 5, 8, seed=24)
    compressed = torch.triu(torch.ones(2048, 2048), 1).bool()
    out, lse = torch_npu.npu_fused_infer_attention_score(
        q.to(NPU), k.to(NPU), v.to(NPU), atten_mask=compressed.to(NPU), actual_seq_lengths_kv=[5, 4], num_heads=4,
        num_key_value_heads=2, scale=0.3, input_layout="BNSD_BSND", sparse_mode=3, softmax_lse_flag=True)
    kv_lens = [5, 4]

    def rule(b, n, i, j):  # bottom-right causal on each item's valid keys
        return j < kv_lens[b] and j <= i + kv_lens[b] - 3

    torch.testing.assert_close(out.cpu(), _ref(q, k, v, 0.3, rule).transpose(1, 2), **TOL)
    torch.testing.assert_close(lse.cpu(), _ref_lse(q, k, 0.3, rule), **TOL)


def test_fused_infer_incremental_branch():
    q, k, v = _rand(2, 2, 1, 8, seed=25), _rand(2, 2, 6, 8, seed=26), _rand(2, 2, 6, 8, seed=27)
    mask = torch.rand(2, 6, generator=torch.Generator().manual_seed(28)) > 0.6
    mask[:, 0] = False
    lens = [6, 3]

    def rule(b, n, i, j):
        return j < lens[b] and not mask[b, j]

    out, lse = torch_npu.npu_fused_infer_attention_score(
        _bsh(q).to(NPU), _bsh(k).to(NPU), _bsh(v).to(NPU), atten_mask=mask.to(NPU), actual_seq_lengths_kv=lens,
        num_heads=2, scale=0.5, softmax_lse_flag=True)
    torch.testing.assert_close(out.cpu(), _bsh(_ref(q, k, v, 0.5, rule)), **TOL)
    torch.testing.assert_close(lse.cpu(), _ref_lse(q, k, 0.5, rule), **TOL)
    _, none = torch_npu.npu_fused_infer_attention_score(_bsh(q).to(NPU), _bsh(k).to(NPU), _bsh(v).to(NPU),
                                                        num_heads=2)
    assert none.shape == (1,) and none.item() == 0
    with pytest.raises(ValueError, match="npu_fused_infer_attention_score: query_rope"):
        torch_npu.npu_fused_infer_attention_score(_bsh(q).to(NPU), _bsh(k).to(NPU), _bsh(v).to(NPU), num_heads=2,
                                                  query_rope=_bsh(q).to(NPU))


def test_infer_attention_compile():
    def fn(q, k, v, mask):
        a = ops.npu_prompt_flash_attention(q, k, v, atten_mask=mask, num_heads=2, scale_value=0.5, next_tokens=0)
        b = ops.npu_incre_flash_attention(q[:, :1], k, v, num_heads=2, scale_value=0.5, actual_seq_lengths=[3, 2])
        c, lse = ops.npu_fused_infer_attention_score(q, k, v, num_heads=2, scale=0.5, softmax_lse_flag=True)
        return a, b, c, lse

    q, k = torch.randn(2, 3, 16).to(NPU), torch.randn(2, 4, 16).to(NPU)
    v, mask = torch.randn(2, 4, 16).to(NPU), torch.ones(3, 4, dtype=torch.bool).triu(1).to(NPU)
    eager = fn(q, k, v, mask)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(q, k, v, mask)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
