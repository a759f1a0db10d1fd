"""npu_block_sparse_attention against a per-(item, head, query row) loop of softmax(scale q.k) v over the keys
whose block the block mask selects, with the gradients of that loop."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, leaf, ops, ref_leaf


def _ref_item(q, k, v, mask, shape, scale, q_len, kv_len):
    """q (N1, Sq, D), k/v (N2, Skv, D), mask (N1, Bq, Bkv) -> out (N1, Sq, D) and lse list."""
    n1, sq, _ = q.shape
    groups = n1 // k.shape[0]
    rows, lses = [], []
    for n in range(n1):
        head, head_lse = [], []
        for i in range(sq):
            keys = [j for j in range(kv_len) if i < q_len and mask[n, i // shape[0], j // shape[1]]]
            if not keys:
                head.append(q[n, i] * 0)
                head_lse.append(-math.inf)
                continue
            s = torch.stack([scale * (q[n, i] @ k[n // groups, j]) for j in keys])
            p = torch.softmax(s, 0)
            head.append(sum(p[t] * v[n // groups, j] for t, j in enumerate(keys)))
            head_lse.append(torch.logsumexp(s, 0).item())
        rows.append(torch.stack(head))
        lses.append(head_lse)
    return torch.stack(rows), lses


def _rand(*shape, seed):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_block_sparse_attention_bnsd_gqa_with_gradients():
    q, k, v = _rand(2, 4, 6, 8, seed=0), _rand(2, 2, 7, 8, seed=1), _rand(2, 2, 7, 8, seed=2)
    shape = [2, 3]
    mask = torch.rand(2, 4, 3, 3, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[0, 0, 0] = False  # query block 0 of head 0 selects nothing: rows 0-1 give 0
    q_lens, kv_lens = [6, 4], [7, 5]
    n = [leaf(t) for t in (q, k, v)]
    out, lse = torch_npu.npu_block_sparse_attention(*n, mask.int().to(NPU), shape, q_input_layout="BNSD",
                                                    kv_input_layout="BNSD", num_key_value_heads=2, scale_value=0.4,
                                                    actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens,
                                                    softmax_lse_flag=1)
    r = [ref_leaf(t) for t in (q, k, v)]
    refs = [_ref_item(r[0][b], r[1][b], r[2][b], mask[b], shape, 0.4, q_lens[b], kv_lens[b]) for b in range(2)]
    ref = torch.stack([o for o, _ in refs])
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    torch.testing.assert_close(lse.cpu(), torch.tensor([lse_b for _, lse_b in refs]).unsqueeze(-1).float())
    dy = _rand(*ref.shape, seed=4)
    for a, b in zip(torch.autograd.grad(out, n, dy.to(NPU)), torch.autograd.grad(ref, r, dy)):
        torch.testing.assert_close(a.cpu(), b)


def test_block_sparse_attention_tnd():
    q, k, v = _rand(9, 2, 8, seed=5), _rand(11, 2, 8, seed=6), _rand(11, 2, 8, seed=7)
    q_lens, kv_lens, shape = [4, 5], [6, 5], [2, 4]
    mask = torch.rand(2, 2, 3, 2, generator=torch.Generator().manual_seed(8)) > 0.3
    out, none = torch_npu.npu_block_sparse_attention(q.to(NPU), k.to(NPU), v.to(NPU), mask.to(NPU), shape,
                                                     num_key_value_heads=2, scale_value=0.5,
                                                     actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens)
    assert none.shape == (1,) and none.item() == 0
    qb, kb = q.split(q_lens), k.split(kv_lens)
    vb = v.split(kv_lens)
    want = torch.cat([_ref_item(qb[b].transpose(0, 1), kb[b].transpose(0, 1), vb[b].transpose(0, 1), mask[b], shape,
                                0.5, q_lens[b], kv_lens[b])[0].transpose(0, 1) for b in range(2)])
    torch.testing.assert_close(out.cpu(), want)


def test_block_sparse_attention_rejects_bad_arguments():
    q = torch.randn(2, 2, 4, 8).to(NPU)
    mask = torch.ones(2, 2, 1, 1, dtype=torch.int8).to(NPU)
    kw = dict(q_input_layout="BNSD", kv_input_layout="BNSD", num_key_value_heads=2)
    for extra, word in ((dict(kv_input_layout="TND"), "q_input_layout"), (dict(inner_precise=2), "inner_precise"),
                        (dict(actual_seq_lengths=[4, 4]), "actual_seq_lengths and actual_seq_lengths_kv"),
                        (dict(num_key_value_heads=3), "num_key_value_heads")):
        with pytest.raises(ValueError, match=f"npu_block_sparse_attention: {word}"):
            torch_npu.npu_block_sparse_attention(q, q, q, mask, [4, 4], **{**kw, **extra})
    with pytest.raises(ValueError, match="npu_block_sparse_attention: block_sparse_mask must be"):
        torch_npu.npu_block_sparse_attention(q, q, q, mask, [2, 4], **kw)


def test_block_sparse_attention_compile():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(8, 2, 4, generator=g) for _ in range(3))
    mask = (torch.rand(1, 2, 2, 2, generator=g) > 0.3).to(NPU)

    def fn(q, k, v):
        out, lse = ops.npu_block_sparse_attention(q, k, v, mask, [4, 4], num_key_value_heads=2, scale_value=0.5,
                                                  actual_seq_lengths=[8], actual_seq_lengths_kv=[8])
        return out.square().sum()

    grads = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        ins = [leaf(t) for t in (q, k, v)]
        f(*ins).backward()
        grads.append([t.grad.cpu() for t in ins])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
