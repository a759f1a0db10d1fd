"""torch_npu's split routing-map unpermute: ``_npu_moe_token_unpermute_with_routing_map`` (the forward returning the
indices its gradient reads) and ``npu_moe_token_unpermute_with_routing_map_grad``, as a hand-written
autograd.Function (torchtitan-npu's expert-parallel combine) calls them; checked against references written from
the math: out[t] = sum over t's (token, k) pairs of permuted[row of the pair] (* probs[t, expert])."""
import pytest
import torch

import torch_npu
from tests.ops._common import NPU, ref_leaf

F64 = torch.float64


def _permuted_with_routing_map(n, e, topk, h, seed):
    torch.manual_seed(seed)
    rm = torch.zeros(n, e, dtype=torch.bool)
    for t in range(n):
        rm[t, torch.randperm(e)[:topk]] = True
    tokens = torch.randn(n, h, dtype=F64)
    permuted, _, si = torch_npu.npu_moe_token_permute_with_routing_map(
        tokens.to(NPU), rm.to(NPU), num_out_tokens=n * topk)
    # distinct rows, so a wrong row in the gather shows
    permuted = permuted.cpu() * torch.arange(1, n * topk + 1, dtype=F64).unsqueeze(1)
    pairs = [(t, x) for x in range(e) for t in range(n) if rm[t, x]]   # permuted order: expert-major
    return rm, permuted, si, pairs


def test_forward_returns_the_unpermute_and_its_indices():
    n, e, topk, h = 5, 4, 2, 3
    rm, permuted, si, pairs = _permuted_with_routing_map(n, e, topk, h, seed=0)
    probs = torch.rand(n, e, dtype=F64)
    out, out_index, token_id, pprobs = torch_npu._npu_moe_token_unpermute_with_routing_map(
        permuted.to(NPU), si, [n, h], probs=probs.to(NPU), routing_map=rm.to(NPU))
    ref = torch.stack([sum(permuted[pairs.index((t, x))] * probs[t, x] for x in range(e) if rm[t, x])
                       for t in range(n)])
    torch.testing.assert_close(out.cpu(), ref)
    assert out_index.tolist() == si.tolist()
    assert token_id.tolist() == [i // topk for i in range(n * topk)]
    # weight of pair (t, k): probs at t's k-th expert in ascending order
    ref_w = [probs[t, [x for x in range(e) if rm[t, x]][k]].item() for t in range(n) for k in range(topk)]
    torch.testing.assert_close(pprobs.cpu(), torch.tensor(ref_w, dtype=F64))
    plain, _, _, none = torch_npu._npu_moe_token_unpermute_with_routing_map(permuted.to(NPU), si, [n, h])
    assert none is None
    torch.testing.assert_close(plain.cpu(), torch.stack(
        [sum(permuted[pairs.index((t, x))] for x in range(e) if rm[t, x]) for t in range(n)]))


def test_grad_without_probs_needs_no_permuted_tokens():
    n, e, topk, h = 6, 5, 3, 4
    rm, permuted, si, pairs = _permuted_with_routing_map(n, e, topk, h, seed=1)
    grad = torch.randn(n, h, dtype=F64)
    dperm, dprobs = torch_npu.npu_moe_token_unpermute_with_routing_map_grad(
        grad.to(NPU), si, si, None, None, None, False, [n, h])
    assert dprobs is None
    ref = torch.zeros(n * topk, h, dtype=F64)
    for slot, (t, _) in enumerate(pairs):
        ref[slot] = grad[t]            # each permuted row received its token's gradient
    torch.testing.assert_close(dperm.cpu(), ref)


def test_grad_with_probs_matches_autograd_of_the_reference():
    n, e, topk, h = 5, 4, 2, 3
    rm, permuted, si, pairs = _permuted_with_routing_map(n, e, topk, h, seed=2)
    probs = torch.rand(n, e, dtype=F64)
    pr, qr = ref_leaf(permuted), ref_leaf(probs)
    ref = torch.stack([sum(pr[pairs.index((t, x))] * qr[t, x] for x in range(e) if rm[t, x]) for t in range(n)])
    grad = torch.randn(n, h, dtype=F64)
    ref.backward(grad)
    _, out_index, token_id, _ = torch_npu._npu_moe_token_unpermute_with_routing_map(
        permuted.to(NPU), si, [n, h], probs=probs.to(NPU), routing_map=rm.to(NPU))
    dperm, dprobs = torch_npu.npu_moe_token_unpermute_with_routing_map_grad(
        grad.to(NPU), out_index, token_id, rm.to(NPU), permuted.to(NPU), probs.to(NPU), False, [n, h])
    torch.testing.assert_close(dperm.cpu(), pr.grad)
    torch.testing.assert_close(dprobs.cpu(), qr.grad)


def test_grad_bad_input_names_the_problem():
    n, h = 4, 2
    si = torch.arange(n * 2, dtype=torch.int32, device=NPU)
    grad = torch.zeros(n, h, device=NPU)
    op = torch_npu.npu_moe_token_unpermute_with_routing_map_grad
    with pytest.raises(ValueError, match="probs' gradient needs permuted_tokens and routing_map"):
        op(grad, si, si, None, None, torch.zeros(n, 3, device=NPU), False, [n, h])
    with pytest.raises(ValueError, match="restore_shape"):
        op(grad, si, si, None, None, None, False, [n + 1, h])
    with pytest.raises(ValueError, match="out_index and permuted_token_id"):
        op(grad, si, si[:-1], None, None, None, False, [n, h])
