"""MoE operators (token permute/unpermute in both forms, grouped matmul's split-K and list forms, grouped
matmul add, the inference routing trio) against reference math written here from torch_npu's documentation."""
import pytest
import torch

import torch_npu

NPU = torch.device("npu:0")
ops = torch.ops.npu
F64 = torch.float64


def _leaf(t):
    return t.detach().to(NPU).requires_grad_(True)


def _ref_leaf(t):
    return t.detach().clone().requires_grad_(True)


def _check(out_npu, out_ref, ins_npu, ins_ref, seed=0):
    """Values, then the gradients of <out, g> for a random g, npu against the reference."""
    torch.testing.assert_close(out_npu.detach().cpu(), out_ref.detach())
    g = torch.randn(out_ref.shape, dtype=out_ref.dtype, generator=torch.Generator().manual_seed(seed))
    gn = torch.autograd.grad(out_npu, ins_npu, g.to(NPU), allow_unused=True, retain_graph=True)
    gr = torch.autograd.grad(out_ref, ins_ref, g, allow_unused=True, retain_graph=True)
    for a, b in zip(gn, gr):
        torch.testing.assert_close(a.cpu(), b if b is not None else torch.zeros_like(a.cpu()))


# ---- reference: the (token, k) pairs sorted stably by expert ----------------------------------------------
def _ref_order(indices):
    flat = indices.reshape(-1).tolist()
    return sorted(range(len(flat)), key=lambda i: flat[i])  # Python's sort is stable


def test_permute_matches_documented_examples():
    tokens = torch.tensor([[1, 1], [2, 2], [3, 3], [4, 4]], dtype=torch.float16)
    indices = torch.tensor([[0, 1], [1, 0], [0, 2], [2, 0]])
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(tokens.to(NPU), indices.to(NPU))
    assert permuted.cpu()[:, 0].tolist() == [1, 2, 3, 4, 1, 2, 3, 4]
    assert sorted_indices.dtype == torch.int32 and sorted_indices.cpu().tolist() == [0, 4, 5, 1, 2, 6, 7, 3]
    probs = torch.ones(4, 2, dtype=torch.float16) / 2
    out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs=probs.to(NPU))
    torch.testing.assert_close(out.cpu(), tokens)


@pytest.mark.parametrize("num_out_tokens", [None, 0, 13, -5])
def test_permute_and_unpermute_forward_backward(num_out_tokens):
    torch.manual_seed(0)
    n, topk, h, e = 6, 3, 4, 4
    tokens = torch.randn(n, h, dtype=F64)
    indices = torch.randint(0, e, (n, topk))
    order = _ref_order(indices)
    rows = {None: n * topk, 0: n * topk, 13: 13, -5: n * topk - 5}[num_out_tokens]
    tn, tr = _leaf(tokens), _ref_leaf(tokens)
    permuted, sorted_indices = ops.npu_moe_token_permute(tn, indices.to(NPU), num_out_tokens)
    ref = torch.stack([tr[order[j] // topk] for j in range(rows)])
    _check(permuted, ref, (tn,), (tr,))
    inverse = [order.index(i) for i in range(n * topk)]  # where pair i landed
    assert sorted_indices.cpu().tolist() == inverse
    # unpermute: out[t] = sum_k permuted[sorted_indices[t*topk+k]] * probs[t, k]; dropped rows add nothing
    probs = torch.rand(n, topk, dtype=F64)
    pn, pr = _leaf(ref), _ref_leaf(ref)
    qn, qr = _leaf(probs), _ref_leaf(probs)
    out = ops.npu_moe_token_unpermute(pn, sorted_indices, qn)
    ref_out = torch.stack([sum(pr[inverse[t * topk + k]] * qr[t, k] for k in range(topk)
                               if inverse[t * topk + k] < rows) for t in range(n)])
    _check(out, ref_out, (pn, qn), (pr, qr), seed=1)


def test_permute_one_dim_indices_and_unpermute_without_probs():
    tokens = torch.randn(5, 3, dtype=F64)
    indices = torch.tensor([2, 0, 2, 1, 0], dtype=torch.int32)
    tn, tr = _leaf(tokens), _ref_leaf(tokens)
    permuted, si = ops.npu_moe_token_permute(tn, indices.to(NPU))
    order = _ref_order(indices)
    _check(permuted, tr[order], (tn,), (tr,))
    back = ops.npu_moe_token_unpermute(permuted, si)
    torch.testing.assert_close(back.detach().cpu(), tokens)


def _routed(routing_map):
    """[(token, expert)] in the permuted order: expert-major, tokens ascending."""
    n, e = routing_map.shape
    return [(t, x) for x in range(e) for t in range(n) if routing_map[t, x]]


def test_permute_with_routing_map_and_its_inverse():
    torch.manual_seed(1)
    n, e, topk, h = 5, 4, 2, 3
    rm = torch.zeros(n, e, dtype=torch.bool)
    for t in range(n):
        rm[t, torch.randperm(e)[:topk]] = True
    tokens, probs = torch.randn(n, h, dtype=F64), torch.rand(n, e, dtype=F64)
    tn, tr, qn, qr = _leaf(tokens), _ref_leaf(tokens), _leaf(probs), _ref_leaf(probs)
    permuted, pprobs, si = torch_npu.npu_moe_token_permute_with_routing_map(
        tn, rm.to(torch.int8).to(NPU), probs=qn, num_out_tokens=n * topk)
    pairs = _routed(rm)
    ref = torch.stack([tr[t] for t, _ in pairs])
    ref_probs = torch.stack([qr[t, x] for t, x in pairs])
    _check(permuted, ref, (tn,), (tr,))
    _check(pprobs, ref_probs, (qn,), (qr,), seed=2)
    # pair (t, k): the k-th expert of token t in ascending order
    for t in range(n):
        experts = [x for x in range(e) if rm[t, x]]
        for k, x in enumerate(experts):
            assert int(si[t * topk + k]) == pairs.index((t, x))
    # unpermute with the routing map: out[t] = sum over t's experts of permuted[slot] * probs[t, expert]
    pn, pr = _leaf(ref), _ref_leaf(ref)
    qn2, qr2 = _leaf(probs), _ref_leaf(probs)
    out = torch_npu.npu_moe_token_unpermute_with_routing_map(pn, si, [n, h], probs=qn2, routing_map=rm.to(NPU))
    ref_out = torch.stack([sum(pr[pairs.index((t, x))] * qr2[t, x] for x in range(e) if rm[t, x])
                           for t in range(n)])
    _check(out, ref_out, (pn, qn2), (pr, qr2), seed=3)
    plain = torch_npu.npu_moe_token_unpermute_with_routing_map(pn, si, [n, h])
    torch.testing.assert_close(plain.detach().cpu(), tokens * topk)


def test_permute_with_routing_map_drop_and_pad():
    n, e, h, cap = 4, 2, 3, 3
    rm = torch.tensor([[1, 0], [1, 1], [0, 1], [1, 0]], dtype=torch.bool)
    tokens, probs = torch.randn(n, h, dtype=F64), torch.rand(n, e, dtype=F64) * rm
    tn, tr, qn, qr = _leaf(tokens), _ref_leaf(tokens), _leaf(probs), _ref_leaf(probs)
    permuted, pprobs, si = ops.npu_moe_token_permute_with_routing_map(
        tn, rm.to(NPU), probs=qn, num_out_tokens=cap * e, drop_and_pad=True)
    # each expert: its routed tokens in order, then its unrouted ones, cut at capacity
    slots = []
    for x in range(e):
        chosen = [t for t in range(n) if rm[t, x]] + [t for t in range(n) if not rm[t, x]]
        slots += [(t, x) for t in chosen[:cap]]
    assert si.cpu().tolist() == [t for t, _ in slots]
    _check(permuted, torch.stack([tr[t] for t, _ in slots]), (tn,), (tr,))
    _check(pprobs, torch.stack([qr[t, x] for t, x in slots]), (qn,), (qr,), seed=4)
    ref = torch.stack([tr[t] for t, _ in slots])
    pn, pr = _leaf(ref), _ref_leaf(ref)
    qn2, qr2 = _leaf(probs), _ref_leaf(probs)
    out = ops.npu_moe_token_unpermute_with_routing_map(pn, si, [n, h], probs=qn2, routing_map=rm.to(NPU),
                                                       drop_and_pad=True)
    ref_out = torch.zeros(n, h, dtype=F64)
    for j, (t, x) in enumerate(slots):
        ref_out = ref_out.index_add(0, torch.tensor([t]), (pr[j] * qr2[t, x]).unsqueeze(0))
    _check(out, ref_out, (pn, qn2), (pr, qr2), seed=5)


# ---- grouped matmul -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("split_item", [3, 0])
def test_grouped_matmul_split_k_is_the_experts_weight_gradient(split_item):
    """torchtitan-npu's call: npu_grouped_matmul([x.T], [dy], group_list=counts, split_item=3, group_type=2,
    group_list_type=1) -> (E, hidden, N); tokens past the last group take no part."""
    torch.manual_seed(2)
    x, dy, counts = torch.randn(9, 4, dtype=F64), torch.randn(9, 3, dtype=F64), [3, 0, 5]
    xn, dn, xr, dr = _leaf(x), _leaf(dy), _ref_leaf(x), _ref_leaf(dy)
    out = torch_npu.npu_grouped_matmul([xn.t()], [dn], bias=None, group_list=torch.tensor(counts).to(NPU),
                                       split_item=split_item, group_type=2, group_list_type=1)
    ends = [0, 3, 3, 8]
    parts = [xr[a:b].t() @ dr[a:b] for a, b in zip(ends[:-1], ends[1:])]
    if split_item == 3:
        assert len(out) == 1 and out[0].shape == (3, 4, 3)
        _check(out[0], torch.stack(parts), (xn, dn), (xr, dr))
    else:
        assert len(out) == 3
        _check(out[2], parts[2], (xn, dn), (xr, dr))
        assert not out[1].any()


def test_grouped_matmul_int_list_forms():
    """torch_npu's List[int] forms: one x split along M over several weights (cumulative group_list), and
    several x with one concatenated output."""
    torch.manual_seed(3)
    x, ws = torch.randn(7, 4, dtype=F64), [torch.randn(4, 2, dtype=F64) for _ in range(2)]
    xn, xr = _leaf(x), _ref_leaf(x)
    wn, wr = [_leaf(w) for w in ws], [_ref_leaf(w) for w in ws]
    out = ops.npu_grouped_matmul([xn], wn, group_list=[3, 7], split_item=2)
    _check(out[0], torch.cat([xr[:3] @ wr[0], xr[3:] @ wr[1]]), [xn, *wn], [xr, *wr])
    xs = [torch.randn(2, 4, dtype=F64), torch.randn(3, 4, dtype=F64)]
    xsn, xsr = [_leaf(t) for t in xs], [_ref_leaf(t) for t in xs]
    out = ops.npu_grouped_matmul(xsn, wn, group_list=[2, 5], split_item=3, group_type=0)
    _check(out[0], torch.cat([xsr[0] @ wr[0], xsr[1] @ wr[1]]), [*xsn, *wn], [*xsr, *wr])
    with pytest.raises(ValueError, match="does not match the rows"):
        ops.npu_grouped_matmul(xsn, wn, group_list=[3, 5], split_item=3, group_type=0)
    with pytest.raises(ValueError, match="group_type 1"):
        ops.npu_grouped_matmul([xn], wn, group_list=[3, 7], split_item=3, group_type=1)


@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_matmul_add(group_list_type):
    torch.manual_seed(4)
    k, m, n = 10, 3, 2
    x, w, y = torch.randn(k, m, dtype=F64), torch.randn(k, n, dtype=F64), torch.randn(3, m, n, dtype=F64)
    counts = [4, 0, 5]
    gl = torch.tensor(counts).cumsum(0) if group_list_type == 0 else torch.tensor(counts)
    xn, wn, yn = _leaf(x), _leaf(w), _leaf(y)
    xr, wr, yr = _ref_leaf(x), _ref_leaf(w), _ref_leaf(y)
    out = torch_npu.npu_grouped_matmul_add(yn, xn, wn, gl.to(NPU), group_list_type=group_list_type)
    ends = [0, 4, 4, 9]
    ref = yr + torch.stack([xr[a:b].t() @ wr[a:b] for a, b in zip(ends[:-1], ends[1:])])
    _check(out, ref, (yn, xn, wn), (yr, xr, wr))
    acc = y.clone().to(NPU)
    assert torch_npu.npu_grouped_matmul_add_(acc, x.to(NPU), w.to(NPU), gl.to(NPU),
                                             group_list_type=group_list_type) is acc
    torch.testing.assert_close(acc.cpu(), ref.detach())
    with pytest.raises(ValueError, match="transpose_x=True"):
        torch_npu.npu_grouped_matmul_add(yn, xn, wn, gl.to(NPU), transpose_x=False)


# ---- inference routing ------------------------------------------------------------------------------------
def test_init_routing_compute_expert_tokens_finalize_routing():
    torch.manual_seed(5)
    rows, k, h, e = 4, 2, 3, 3
    x = torch.randn(rows, h)
    expert_idx = torch.tensor([[1, 2], [0, 1], [0, 2], [2, 1]], dtype=torch.int32)
    row_idx = (torch.arange(k).unsqueeze(0) * rows + torch.arange(rows).unsqueeze(1)).to(torch.int32)
    ex, exp_row, exp_expert = ops.npu_moe_init_routing(x.to(NPU), row_idx.to(NPU), expert_idx.to(NPU), 3)
    # documented: sort (expert, row_idx) pairs by expert; expanded_row_idx[sorted_row[i]] = i;
    # expanded_x[i] = x[sorted_row[i] % rows] for the first min(rows, active_num) * k rows
    pairs = sorted(zip(expert_idx.reshape(-1).tolist(), row_idx.reshape(-1).tolist()))
    sorted_row = [r for _, r in pairs]
    assert exp_expert.cpu().tolist() == [x_ for x_, _ in pairs]
    assert [sorted_row.index(i) for i in range(rows * k)] == exp_row.cpu().tolist()
    torch.testing.assert_close(ex.cpu(), x[[r % rows for r in sorted_row[:3 * k]]])
    tokens = ops.npu_moe_compute_expert_tokens(exp_expert, e)
    assert tokens.cpu().tolist() == [sum(1 for x_, _ in pairs if x_ <= i) for i in range(e)]
    # finalize: out[i] = skip1 + skip2 + sum_k scales[i,k] * (rows[src_to_dst[i + k*rows]] + bias[expert[i,k]])
    permuted = torch.randn(rows * k, h)
    skip1, skip2, bias, scales = torch.randn(rows, h), torch.randn(rows, h), torch.randn(e, h), torch.rand(rows, k)
    out = ops.npu_moe_finalize_routing(permuted.to(NPU), skip1.to(NPU), skip2.to(NPU), bias.to(NPU),
                                       scales.to(NPU), exp_row, expert_idx.to(NPU), 0, k)
    dst = exp_row.cpu().tolist()
    ref = torch.stack([skip1[i] + skip2[i] + sum(scales[i, j] * (permuted[dst[i + j * rows]] + bias[expert_idx[i, j]])
                                                 for j in range(k)) for i in range(rows)])
    torch.testing.assert_close(out.cpu(), ref)
    out = ops.npu_moe_finalize_routing(permuted.to(NPU), None, None, None, None, exp_row, None, 0, k)
    torch.testing.assert_close(out.cpu(), torch.stack([sum(permuted[dst[i + j * rows]] for j in range(k))
                                                       for i in range(rows)]))
    with pytest.raises(ValueError, match="skip2 needs skip1"):
        ops.npu_moe_finalize_routing(permuted.to(NPU), None, skip2.to(NPU), None, scales.to(NPU), exp_row, None)


def test_moe_bad_inputs_name_the_problem():
    t = torch.randn(4, 2, device=NPU)
    with pytest.raises(ValueError, match="padded_mode"):
        ops.npu_moe_token_permute(t, torch.zeros(4, 1, dtype=torch.long, device=NPU), None, True)
    with pytest.raises(ValueError, match="indices has 3 rows"):
        ops.npu_moe_token_permute(t, torch.zeros(3, 1, dtype=torch.long, device=NPU))
    with pytest.raises(ValueError, match="route to num_out_tokens // num_tokens = 1"):
        ops.npu_moe_token_permute_with_routing_map(t, torch.ones(4, 2, dtype=torch.bool, device=NPU))
    with pytest.raises(ValueError, match="num_expert"):
        ops.npu_moe_compute_expert_tokens(torch.zeros(3, dtype=torch.int32, device=NPU), 0)


def test_moe_block_compiles_in_one_graph_with_backward():
    """permute -> experts (grouped matmul, split M) -> unpermute traced by torch.compile through the fake kernels
    (one graph, no breaks) and differentiated; values and gradients equal eager."""
    torch.manual_seed(6)
    n, h, e, topk = 6, 4, 3, 2
    tokens, w = torch.randn(n, h), torch.randn(e, h, h)
    indices = torch.stack([torch.randperm(e)[:topk] for _ in range(n)]).to(NPU)
    probs = torch.rand(n, topk).to(NPU)
    counts = torch.bincount(indices.cpu().reshape(-1), minlength=e).tolist()

    def block(t, w):
        permuted, si = ops.npu_moe_token_permute(t, indices)
        y = ops.npu_grouped_matmul([permuted], [w], group_list=counts, split_item=3, group_type=0,
                                   group_list_type=1)[0]
        dw = ops.npu_grouped_matmul([permuted.t()], [y], group_list=counts, split_item=3, group_type=2,
                                    group_list_type=1)[0]
        return ops.npu_moe_token_unpermute(y, si, probs), dw

    results = []
    for fn in (block, torch.compile(block, backend="aot_eager", fullgraph=True)):
        t, wn = _leaf(tokens), _leaf(w)
        out, dw = fn(t, wn)
        (out.pow(2).sum() + dw.sum()).backward()
        results.append((out.detach().cpu(), dw.detach().cpu(), t.grad.cpu(), wn.grad.cpu()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)
