"""npu_nsa_select_attention_infer against a per-item, per-head loop that reads the selected blocks from the items'
contiguous key/value sequences (the test builds the paged pools from them through a shuffled block table, so the
loop never sees the paging), plus its fake kernel and the documented constraints."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from ._common import NPU, ops

D, DV = 192, 128
SCALE = D ** -0.5


def _ref(q, k_seq, v_seq, topk, lens, sbs, scale=SCALE):
    """q (B, N, D), k_seq (B, S, N_kv, D), v_seq (B, S, N_kv, Dv), topk nested lists -> (B, N, Dv) float64."""
    batch, heads, _ = q.shape
    group = heads // k_seq.shape[2]
    out = torch.zeros(batch, heads, v_seq.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            kvh = h // group
            tokens = []
            for i in topk[b][kvh]:
                if i >= 0:
                    tokens += [t for t in range(i * sbs, (i + 1) * sbs) if t < lens[b]]
            if not tokens:
                continue
            k = torch.stack([k_seq[b, t, kvh] for t in tokens]).double()
            v = torch.stack([v_seq[b, t, kvh] for t in tokens]).double()
            p = torch.softmax(q[b, h].double() @ k.T * scale, -1)
            out[b, h] = p @ v
    return out


def _case(seed, *, batch=3, heads=4, kv_heads=2, sbs=32, page=64, count=3, lens=(150, 70, 200), max_blocks=4,
          spare=3, dtype=torch.float16, topk=None):
    """Random query, contiguous per-item key/value, their paged pools and table, and a topk selection."""
    g = torch.Generator().manual_seed(seed)
    seq = max_blocks * page
    q = torch.randn(batch, heads, D, generator=g).to(dtype)
    k_seq = torch.randn(batch, seq, kv_heads, D, generator=g).to(dtype)
    v_seq = torch.randn(batch, seq, kv_heads, DV, generator=g).to(dtype)
    block_num = batch * max_blocks + spare
    # unused blocks and rows hold other random data: reading them would change the result
    k_pool = torch.randn(block_num, page, kv_heads, D, generator=g).to(dtype)
    v_pool = torch.randn(block_num, page, kv_heads, DV, generator=g).to(dtype)
    table = torch.randperm(block_num, generator=g)[:batch * max_blocks].reshape(batch, max_blocks)
    for b in range(batch):
        for j in range(max_blocks):
            k_pool[table[b, j]] = k_seq[b, j * page:(j + 1) * page]
            v_pool[table[b, j]] = v_seq[b, j * page:(j + 1) * page]
    if topk is None:
        topk = []
        for b in range(batch):
            blocks = math.ceil(lens[b] / sbs)
            rows = []
            for _ in range(kv_heads):
                pick = torch.randperm(blocks, generator=g)[:count].tolist()
                pick += [-1] * (count - len(pick))
                if len(pick) > 1 and torch.rand(1, generator=g).item() < 0.5:
                    pick[-1] = -1  # padding inside a selection that could be full
                rows.append(pick)
            topk.append(rows)
    return dict(q=q, k_seq=k_seq, v_seq=v_seq, k_pool=k_pool, v_pool=v_pool, table=table.int(), topk=topk,
                lens=list(lens), sbs=sbs, page=page, count=count, heads=heads, kv_heads=kv_heads)


def _query(q, layout):
    """(B, N, D) in the query layout."""
    return {"BSH": q.flatten(1)[:, None], "BSND": q[:, None], "TND": q}[layout]


def _heads_of(out, layout, heads):
    return {"BSH": lambda o: o[:, 0].unflatten(-1, (heads, -1)), "BSND": lambda o: o[:, 0],
            "TND": lambda o: o}[layout](out)


def _run(c, layout="BSND", pool_rank=4, fn=None, **over):
    k_pool, v_pool = c["k_pool"], c["v_pool"]
    if pool_rank == 3:
        k_pool, v_pool = k_pool.flatten(2), v_pool.flatten(2)
    args = dict(query=_query(c["q"], layout if layout in ("BSH", "TND") else "BSND"), key=k_pool, value=v_pool,
                topk_indices=torch.tensor(c["topk"], dtype=torch.int32), scale_value=SCALE, head_num=c["heads"],
                key_value_head_num=c["kv_heads"], select_block_size=c["sbs"], select_block_count=c["count"],
                page_block_size=c["page"], layout=layout, block_table=c["table"], actual_seq_kvlen=c["lens"])
    args.update(over)
    args = {k: v.to(NPU) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    fn = fn or torch_npu.npu_nsa_select_attention_infer
    pos = [args.pop(k) for k in ("query", "key", "value", "topk_indices", "scale_value", "head_num",
                                 "key_value_head_num", "select_block_size", "select_block_count", "page_block_size")]
    return fn(*pos, **args)


def _expect(c):
    return _ref(c["q"], c["k_seq"], c["v_seq"], c["topk"], c["lens"], c["sbs"])


def _close(out, want, dtype):
    tol = dict(atol=3e-3, rtol=1e-2) if dtype == torch.float16 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.cpu().double(), want, **tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pool_rank", [3, 4])
@pytest.mark.parametrize("layout", ["BSH", "BSND", "TND"])
def test_matches_loop(layout, pool_rank, dtype):
    c = _case(0, dtype=dtype)
    out = _run(c, layout, pool_rank)
    want_shape = {"BSH": (3, 1, 4 * DV), "BSND": (3, 1, 4, DV), "TND": (3, 4, DV)}[layout]
    assert out.shape == want_shape and out.dtype == dtype and out.device.type == "npu"
    _close(_heads_of(out, layout, 4), _expect(c), dtype)


@pytest.mark.parametrize("heads,kv_heads", [(16, 1), (2, 2), (8, 4), (6, 3)])
def test_grouped_query_heads(heads, kv_heads):
    c = _case(1, heads=heads, kv_heads=kv_heads)
    _close(_heads_of(_run(c, "BSH", 3), "BSH", heads), _expect(c), torch.float16)


@pytest.mark.parametrize("sbs,page,count,lens,max_blocks", [
    (128, 64, 2, (300, 129), 5),   # a select block spans two pages; the second item's last block holds one token
    (16, 128, 5, (200, 17), 2),    # many select blocks per page
    (64, 64, 1, (64, 1), 1),       # one block each; a one-token item
    (48, 32, 3, (144, 97), 5),     # select blocks straddle page boundaries
])
def test_paging_and_lengths(sbs, page, count, lens, max_blocks):
    c = _case(2, batch=2, sbs=sbs, page=page, count=count, lens=lens, max_blocks=max_blocks)
    _close(_heads_of(_run(c, "TND", 4), "TND", 4), _expect(c), torch.float16)


def test_lengths_cut_the_selected_blocks():
    """The same selection under two lengths: the tokens past the shorter length take no part."""
    topk = [[[0, 1, 2]], [[2, 0, 1]]]
    full = _case(3, batch=2, heads=2, kv_heads=1, lens=(96, 96), topk=topk, max_blocks=2)
    cut = dict(full, lens=[70, 65])
    a, b = _run(full, "BSND"), _run(cut, "BSND")
    _close(_heads_of(a, "BSND", 2), _expect(full), torch.float16)
    _close(_heads_of(b, "BSND", 2), _expect(cut), torch.float16)
    assert not torch.allclose(a.cpu().float(), b.cpu().float(), atol=1e-2)


def test_padding_duplicates_and_empty_selection():
    # item 0: kv head 0 selects block 1 twice (it counts twice), kv head 1 selects nothing (its heads give 0);
    # item 1 has no tokens at all
    topk = [[[1, 1, 0], [-1, -1, -1]], [[-1, -1, -1], [-1, -1, -1]]]
    c = _case(4, batch=2, lens=(100, 0), topk=topk)
    out = _heads_of(_run(c, "BSND"), "BSND", 4)
    _close(out, _expect(c), torch.float16)
    assert out[0, 2:].abs().sum() == 0 and out[1].abs().sum() == 0
    assert out[0, :2].abs().sum() > 0
    # a duplicate weighs as two copies against block 0: different from block 1 listed once
    once = _heads_of(_run(dict(c, topk=[[[1, 0, -1], [-1, -1, -1]], topk[1]]), "BSND"), "BSND", 4)
    assert not torch.allclose(out[0, :2].cpu().float(), once[0, :2].cpu().float(), atol=1e-3)


def test_documented_example():
    """The page's call: BSH query (1, 1, 768), pools (246, 64, 384) / (246, 64, 256), topk [[[0, -1], [0, -1]]]."""
    g = torch.Generator().manual_seed(5)
    query = torch.randn(1, 1, 768, generator=g).half()
    key = torch.randn(246, 64, 384, generator=g).half()
    value = torch.randn(246, 64, 256, generator=g).half()
    topk = torch.tensor([[[0, -1], [0, -1]]], dtype=torch.int32)
    table = torch.tensor([[1, 0]], dtype=torch.int32)
    out = torch_npu.npu_nsa_select_attention_infer(
        query.to(NPU), key.to(NPU), value.to(NPU), topk.to(NPU), 2.0, 4, 2, 64, 2, 64, layout="BSH",
        atten_mask=None, block_table=table.to(NPU), actual_seq_qlen=None, actual_seq_kvlen=[82])
    assert out.shape == (1, 1, 512) and out.dtype == torch.float16
    # item 0's tokens 0..81 are block 1's 64 rows then block 0's first 18; block 0 of the selection = tokens 0..63
    k_seq = torch.cat([key[1], key[0]]).unflatten(-1, (2, D))[None]
    v_seq = torch.cat([value[1], value[0]]).unflatten(-1, (2, DV))[None]
    want = _ref(query.reshape(1, 4, D), k_seq, v_seq, topk.tolist(), [82], 64, scale=2.0)
    _close(out[:, 0].unflatten(-1, (4, DV)), want, torch.float16)


@pytest.mark.parametrize("layout", ["BSH", "BSND", "TND"])
def test_fake_kernel_shapes(layout):
    c = _case(6)
    with FakeTensorMode(allow_non_fake_inputs=True):
        out = _run(c, layout, 3, fn=ops.npu_nsa_select_attention_infer)
    want = {"BSH": (3, 1, 4 * DV), "BSND": (3, 1, 4, DV), "TND": (3, 4, DV)}[layout]
    assert tuple(out.shape) == want and out.dtype == torch.float16
    with FakeTensorMode(allow_non_fake_inputs=True), \
            pytest.raises(ValueError, match="select_block_size must be a positive multiple of 16"):
        _run(c, layout, 3, fn=ops.npu_nsa_select_attention_infer, select_block_size=24)


def test_compile_fullgraph_matches_eager():
    c = _case(7)

    def fn(q, k, v, topk, table):
        out = ops.npu_nsa_select_attention_infer(q, k, v, topk, SCALE, 4, 2, 32, 3, 64, layout="TND",
                                                 block_table=table, actual_seq_kvlen=[150, 70, 200])
        return out * 2

    args = [c["q"], c["k_pool"], c["v_pool"], torch.tensor(c["topk"], dtype=torch.int32), c["table"]]
    args = [a.to(NPU) for a in args]
    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    torch.testing.assert_close(compiled.cpu(), eager.cpu())
    _close(eager / 2, _expect(c), torch.float16)


def test_opcheck_internal_kernel():
    c = _case(8, batch=2, lens=(150, 70))
    args = (c["q"].to(NPU), c["k_pool"].to(NPU), c["v_pool"].to(NPU),
            torch.tensor(c["topk"], dtype=torch.int32).to(NPU), c["table"].to(NPU), SCALE, 4, 2, 32, 3, 64, "TND",
            [150, 70])
    torch.library.opcheck(torch.ops.npu._nsa_select_attention_infer.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def _bad_cases():
    c = _case(9)
    big = torch.tensor([[[0, 1, 9], [0, 1, 2]], [[0, 1, 2]] * 2, [[0, 1, 2]] * 2], dtype=torch.int32)
    low = torch.tensor([[[0, 1, -2], [0, 1, 2]], [[0, 1, 2]] * 2, [[0, 1, 2]] * 2], dtype=torch.int32)
    table_oob = c["table"].clone()
    table_oob[1, 1] = 99
    q_nc = torch.randn(3, 1, D, 4).half().transpose(2, 3)
    return c, [
        (dict(layout="SBH"), "layout must be one of BSH, BSND, TND"),
        (dict(query=torch.randn(3, 2, 4, D).half()), "query's S must be 1"),
        (dict(query=c["q"][:, None].float()), "query must be float16 or bfloat16"),
        (dict(key=c["k_pool"].bfloat16()), "query, key and value must share one dtype"),
        (dict(query=q_nc), "query must be contiguous"),
        (dict(query=torch.empty(0, 1, 4, D).half()), "query must not be empty"),
        (dict(head_num=3), "head_num \\(3\\) must be a positive multiple of key_value_head_num"),
        (dict(head_num=2), "query has 4 heads, head_num is 2"),
        (dict(query=torch.randn(1, 1, 34, D).half(), head_num=34), "head_num / key_value_head_num must be <= 16"),
        (dict(query=torch.randn(3, 1, 4, 128).half()), "query's head size D must be 192"),
        (dict(key=torch.randn(15, 64, 2, 128).half()), "key \\(block_num, page_block_size, N, D\\) needs"),
        (dict(value=torch.randn(15, 64, 2, D).half()), "value \\(block_num, page_block_size, N, D\\) needs"),
        (dict(value=c["v_pool"][:10].clone()), "key and value must hold the same number of blocks"),
        (dict(key=c["k_pool"][0, 0]), "key must be the paged cache"),
        (dict(page_block_size=32), "key's block size 64 must equal page_block_size"),
        (dict(topk_indices=torch.tensor(c["topk"])), "topk_indices must be int32"),
        (dict(topk_indices=torch.tensor(c["topk"], dtype=torch.int32)[:, :1]), "topk_indices must be \\(B, "),
        (dict(select_block_count=2), "topk_indices must be \\(B, key_value_head_num, select_block_count\\)"),
        (dict(select_block_size=24), "select_block_size must be a positive multiple of 16"),
        (dict(select_block_size=112, select_block_count=3), "select_block_count must be in \\[1, ceil"),
        (dict(block_table=None), "block_table is required"),
        (dict(block_table=c["table"].long()), "block_table must be int32"),
        (dict(block_table=c["table"][:2]), "block_table must be \\(B, max blocks\\)"),
        (dict(block_table=table_oob), "block_table\\[1, 1\\] = 99 must name a block"),
        (dict(actual_seq_kvlen=None), "actual_seq_kvlen .* is required"),
        (dict(actual_seq_kvlen=[150, 70]), "actual_seq_kvlen needs one length per batch item"),
        (dict(actual_seq_kvlen=[150, 70, 257]), "actual_seq_kvlen needs one length per batch item"),
        (dict(actual_seq_kvlen=[150, 40, 200]), "topk_indices\\[1, 0, 2\\] = 2 must be -1"),
        (dict(topk_indices=big), "topk_indices\\[0, 0, 2\\] = 9 must be -1"),
        (dict(topk_indices=low), "topk_indices\\[0, 0, 2\\] = -2 must be -1"),
        (dict(atten_mask=torch.zeros(3, 256, dtype=torch.bool)), "atten_mask is not supported"),
        (dict(actual_seq_qlen=[1, 1, 1]), "actual_seq_qlen is not supported"),
    ]


def test_rejects_documented_constraint_violations():
    c, cases = _bad_cases()
    c = dict(c, topk=[[[0, 1, 2], [0, 1, 2]]] * 3)
    _run(c)  # the base call is valid
    for over, msg in cases:
        with pytest.raises(ValueError, match="npu_nsa_select_attention_infer: " + msg):
            _run(c, **over)


def test_rejects_hardware_limits():
    c = _case(10, batch=1, lens=(100,), max_blocks=2)
    with pytest.raises(ValueError, match="the batch \\(query's B\\) must be <= 3072"):
        _run(c, query=torch.zeros(3073, 1, 4, D).half())
    with pytest.raises(ValueError, match="key_value_head_num must be <= 256"):
        _run(c, query=torch.zeros(1, 1, 257, D).half(), head_num=257, key_value_head_num=257)
    with pytest.raises(ValueError, match="page_block_size must be in \\[1, 128\\]"):
        _run(c, key=torch.zeros(2, 256, 2, D).half(), value=torch.zeros(2, 256, 2, DV).half(), page_block_size=256)
