"""npu_moe_init_routing_v2 (dropless, active_num, expert range, drop/pad, row index types, token counts, dynamic
int8 quant) and npu_grouped_matmul_finalize_routing (float and a8w8, logit, row_index, shared expert) against
reference loops written from torch_npu's documentation."""
import pytest
import torch

import torch_npu
from tests.ops._common import NPU, ops

F64 = torch.float64


def _ref_init(x, expert_idx, expert_num, active_num=-1, rng=None, drop_pad=False, capacity=0):
    """[(slot, pair)] kept, the number of output rows and the per-expert counts, by plain loops."""
    n, k = expert_idx.shape
    start, end = rng or (0, expert_num)
    flat = expert_idx.reshape(-1).tolist()
    pairs = sorted([i for i in range(n * k) if start <= flat[i] < end], key=lambda i: (flat[i], i))
    counts = [sum(1 for i in pairs if flat[i] == ex) for ex in range(start, end)]
    if drop_pad:
        slots, seen = [], {}
        for i in pairs:
            r = seen.get(flat[i], 0)
            seen[flat[i]] = r + 1
            if r < capacity:
                slots.append((flat[i] * capacity + r, i))
        return slots, expert_num * capacity, counts  # counts before dropping
    rows = n * k if active_num <= 0 else min(active_num, n * k)
    return [(j, i) for j, i in enumerate(pairs[:rows])], rows, counts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [
    dict(),
    dict(active_num=4, row_idx_type=1, count_type=0),
    dict(rng=(1, 4), count_type=2),
    dict(rng=(2, 5), row_idx_type=1, count_type=1, scale=True),
    dict(drop_pad=True, capacity=2, count_type=1),
])
def test_init_routing_v2_modes(case):
    torch.manual_seed(0)
    n, k, h, e = 5, 3, 4, 6
    x = torch.randn(n, h, dtype=F64)
    expert_idx = torch.randint(0, e, (n, k), dtype=torch.int32)
    scale = torch.rand(n) if case.get("scale") else None
    kw = dict(expert_num=e, active_num=case.get("active_num", -1), row_idx_type=case.get("row_idx_type", 0),
              expert_tokens_num_flag="count_type" in case, expert_tokens_num_type=case.get("count_type", 0))
    if "rng" in case:
        kw["active_expert_range"] = list(case["rng"])
    if case.get("drop_pad"):
        kw.update(drop_pad_mode=1, expert_capacity=case["capacity"])
    ex, row_idx, tokens_num, ex_scale = torch_npu.npu_moe_init_routing_v2(
        x.to(NPU), expert_idx.to(NPU), scale=None if scale is None else scale.to(NPU), **kw)
    slots, rows, counts = _ref_init(x, expert_idx, e, kw["active_num"], case.get("rng"), case.get("drop_pad", False),
                                    case.get("capacity", 0))
    ref_x = torch.zeros(rows, h, dtype=F64)
    ref_scale = torch.zeros(rows)
    for slot, i in slots:
        ref_x[slot] = x[i // k]
        if scale is not None:
            ref_scale[slot] = scale[i // k]
    torch.testing.assert_close(ex.reshape(rows, h).cpu(), ref_x)
    if case.get("drop_pad"):
        assert ex.shape == (e, case["capacity"], h)
    torch.testing.assert_close(ex_scale.cpu(), ref_scale)
    if kw["row_idx_type"] == 0:  # by pair: its slot, -1 when not kept
        ref_idx = [-1] * (n * k)
        for slot, i in slots:
            ref_idx[i] = slot
    else:  # by slot: its pair
        ref_idx = [i for _, i in slots] + [-1] * (n * k - len(slots))
    assert row_idx.dtype == torch.int32 and row_idx.cpu().tolist() == ref_idx
    if "count_type" not in case:
        assert tokens_num.shape == (0,)
    elif case["count_type"] == 0:
        assert tokens_num.cpu().tolist() == [sum(counts[: j + 1]) for j in range(len(counts))]
    elif case["count_type"] == 1:
        assert tokens_num.cpu().tolist() == counts
    else:
        start = case["rng"][0]
        busy = [[start + j, c] for j, c in enumerate(counts) if c]
        assert tokens_num.cpu().tolist() == busy + [[0, 0]] * (e - len(busy))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("per_expert", [True, False])
def test_init_routing_v2_dynamic_quant(per_expert):
    torch.manual_seed(1)
    n, k, h, e = 4, 2, 8, 4
    x = torch.randn(n, h)
    expert_idx = torch.randint(0, e, (n, k), dtype=torch.int32)
    smooth = torch.rand(e if per_expert else 1, h) + 0.5
    ex, _, _, s = ops.npu_moe_init_routing_v2(x.to(NPU), expert_idx.to(NPU), scale=smooth.to(NPU), expert_num=e,
                                             quant_mode=1)
    slots, _, _ = _ref_init(x, expert_idx, e)
    assert ex.dtype == torch.int8
    flat = expert_idx.reshape(-1).tolist()
    for slot, i in slots:
        row = x[i // k] * smooth[flat[i] if per_expert else 0]
        step = row.abs().max() / 127
        torch.testing.assert_close(s[slot].cpu(), step)
        assert ex[slot].cpu().tolist() == torch.round(row / step).to(torch.int8).tolist()


def _ref_finalize(x, w, sizes, scale=None, pertoken=None, logit=None, row_index=None, shared=None, shared_w=1.0,
                  shared_off=0, rows=None):
    m, n = x.shape[0], w.shape[2]
    out = torch.zeros(rows or m, n, dtype=F64)
    if shared is not None:
        for r in range(shared.shape[0]):
            out[shared_off + r] += shared[r].double() * shared_w
    row = 0
    for g, size in enumerate(sizes):
        for _ in range(size):
            y = torch.tensor([sum(float(x[row, c]) * float(w[g, c, j]) for c in range(x.shape[1]))
                              for j in range(n)], dtype=F64)
            if scale is not None:
                y = y * scale[g].double()
            if pertoken is not None:
                y = y * float(pertoken[row])
            if logit is not None:
                y = y * float(logit[row])
            out[int(row_index[row]) if row_index is not None else row] += y
            row += 1
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_matmul_finalize_routing(quant, group_list_type):
    torch.manual_seed(2)
    e, k, n, topk, batch = 3, 8, 5, 2, 4
    m = batch * topk
    sizes = [3, 0, 4]  # the last row takes no part
    if quant:
        x = torch.randint(-10, 10, (m, k), dtype=torch.int8)
        w = torch.randint(-10, 10, (e, k, n), dtype=torch.int8)
        scale, pertoken = torch.rand(e, n) * 0.01, torch.rand(m) * 0.01
    else:
        x, w = torch.randn(m, k), torch.randn(e, k, n)
        scale = pertoken = None
    logit = torch.rand(m)
    row_index = torch.randint(0, batch, (m,))
    shared = torch.randn(2, n, dtype=torch.bfloat16)
    group_list = torch.tensor(sizes if group_list_type == 1 else [3, 3, 7], dtype=torch.int64)
    out = torch_npu.npu_grouped_matmul_finalize_routing(
        x.to(NPU), w.to(NPU), group_list.to(NPU), scale=None if scale is None else scale.to(NPU),
        pertoken_scale=None if pertoken is None else pertoken.to(NPU), shared_input=shared.to(NPU),
        logit=logit.to(NPU), row_index=row_index.to(NPU), shared_input_weight=0.5, shared_input_offset=1,
        output_bs=batch, group_list_type=group_list_type)
    ref = _ref_finalize(x, w, sizes, scale, pertoken, logit, row_index, shared, 0.5, 1, batch)
    assert out.dtype == torch.float32 and out.shape == (batch, n)
    torch.testing.assert_close(out.cpu(), ref.float(), rtol=1e-5, atol=1e-5)
    plain = ops.npu_grouped_matmul_finalize_routing(x.to(NPU), w.to(NPU), group_list.to(NPU), dtype=torch.bfloat16,
                                                    group_list_type=group_list_type)
    assert plain.dtype == torch.bfloat16
    torch.testing.assert_close(plain.float().cpu(), _ref_finalize(x, w, sizes).float().bfloat16().float())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call,match", [
    (lambda x, e: ops.npu_moe_init_routing_v2(x, e), "npu_moe_init_routing_v2: expert_num"),
    (lambda x, e: ops.npu_moe_init_routing_v2(x, e, expert_num=4, quant_mode=0), "quant_mode"),
    (lambda x, e: ops.npu_moe_init_routing_v2(x, e, expert_num=4, active_expert_range=[3, 1]), "active_expert_range"),
    (lambda x, e: ops.npu_moe_init_routing_v2(x, e, expert_num=4, drop_pad_mode=1), "expert_capacity"),
    (lambda x, e: ops.npu_moe_init_routing_v2(x, e, expert_num=4, row_idx_type=2), "row_idx_type"),
    (lambda x, e: ops.npu_grouped_matmul_finalize_routing(x, x.unsqueeze(0), e[:, 0].long()), "group_list"),
    (lambda x, e: ops.npu_grouped_matmul_finalize_routing(x, x.t().unsqueeze(0).to(torch.int8),
                                                          torch.tensor([1], device=NPU)), "int8"),
])
def test_routing_invalid_arguments_raise(call, match):
    x = torch.randn(4, 4, device=NPU)
    e = torch.zeros(4, 2, dtype=torch.int32, device=NPU)
    with pytest.raises(ValueError, match=match):
        call(x, e)


@pytest.mark.timeout(300)
def test_routing_ops_compile_fullgraph():
    def fn(x, expert_idx, w, group_list):
        ex, row_idx, counts, _ = torch_npu.npu_moe_init_routing_v2(x, expert_idx, expert_num=3, row_idx_type=1,
                                                                   expert_tokens_num_flag=True,
                                                                   expert_tokens_num_type=1)
        return torch_npu.npu_grouped_matmul_finalize_routing(ex, w, group_list, row_index=row_idx // 2,
                                                             output_bs=4), counts

    x, expert_idx = torch.randn(4, 6), torch.randint(0, 3, (4, 2), dtype=torch.int32)
    w = torch.randn(3, 6, 5)
    group_list = torch.bincount(expert_idx.reshape(-1).long(), minlength=3)
    args = (x.to(NPU), expert_idx.to(NPU), w.to(NPU), group_list.to(NPU))
    out_c = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    out_e = fn(*args)
    for a, b in zip(out_c, out_e):
        torch.testing.assert_close(a.cpu(), b.cpu())
    # each token's experts summed back: x[t] @ (w[e1] + w[e2])
    ref = torch.stack([x[t] @ (w[expert_idx[t, 0]] + w[expert_idx[t, 1]]) for t in range(4)])
    torch.testing.assert_close(out_e[0].cpu(), ref, rtol=1e-5, atol=1e-5)


OPCHECK = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.timeout(300)
def test_routing_opcheck():
    x, e = torch.randn(4, 6, device=NPU), torch.randint(0, 3, (4, 2), device=NPU, dtype=torch.int32)
    torch.library.opcheck(ops._moe_init_routing_v2, (x, e, None, None, -1, -1, 3, 0, 1, True, -1, [], 0),
                          test_utils=OPCHECK)
    torch.library.opcheck(ops._moe_init_routing_v2, (x, e, torch.rand(3, 6, device=NPU), None, 5, -1, 3, 0, 2, True,
                                                     1, [0, 3], 1), test_utils=OPCHECK)
    torch.library.opcheck(ops._grouped_matmul_finalize_routing,
                          (x, torch.randn(3, 6, 5, device=NPU), torch.tensor([1, 2, 1], device=NPU), None, None, None,
                           None, None, torch.rand(4, device=NPU), torch.tensor([0, 1, 1, 0], device=NPU), None, 1.0, 0,
                           2, 1), test_utils=OPCHECK)
