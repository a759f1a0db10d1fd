"""Each fused npu operator against the unfused npu composition it replaces (plain torch ops on npu tensors).

Both sides run in alternating rounds (the order reversed every other round), each round timing ``--iters``
calls between ``torch.npu.synchronize()``; the table gives medians over rounds and fused / unfused. Cases
marked "fwd+bwd" time the forward and the backward of ``out.sum()``.

    python benchmarks/fused_ops.py [--rounds 7] [--iters 20] [--only rms_norm,swiglu]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import torch_npu  # noqa: F401  (the npu device and the operators)

NPU = torch.device("npu:0")
ops = torch.ops.npu
T, H, E, TOPK = 2048, 1024, 8, 2  # tokens, hidden, experts, experts per token


def _rand(*shape, grad=False, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=NPU).requires_grad_(grad)


def _rms(x, g, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def _rot_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def _cases():
    """name -> (fused, unfused), each a no-argument callable returning a tensor."""
    c = {}
    x, g, r = _rand(T, H), _rand(H), _rand(T, H)
    c["rms_norm"] = (lambda: ops.npu_rms_norm(x, g)[0], lambda: _rms(x, g))
    c["add_rms_norm"] = (lambda: ops.npu_add_rms_norm(x, r, g)[0], lambda: _rms(x + r, g))
    c["gemma_rms_norm"] = (lambda: ops.npu_gemma_rms_norm(x, g)[0], lambda: _rms(x, 1 + g))
    xg, gg = _rand(T, H, grad=True), _rand(H, grad=True)
    c["rms_norm fwd+bwd"] = (lambda: ops.npu_rms_norm(xg, gg)[0], lambda: _rms(xg, gg))
    x2 = _rand(T, 2 * H)
    c["swiglu"] = (lambda: ops.npu_swiglu(x2), lambda: F.silu(x2[:, :H]) * x2[:, H:])
    x2g = _rand(T, 2 * H, grad=True)
    c["swiglu fwd+bwd"] = (lambda: ops.npu_swiglu(x2g), lambda: F.silu(x2g[:, :H]) * x2g[:, H:])
    c["gelu_mul"] = (lambda: ops.npu_gelu_mul(x2), lambda: F.gelu(x2[:, :H]) * x2[:, H:])
    c["fast_gelu"] = (lambda: ops.npu_fast_gelu(x), lambda: x * torch.sigmoid(1.702 * x))
    q, cos, sin = _rand(4, 512, 8, 128), _rand(1, 512, 1, 128), _rand(1, 512, 1, 128)
    c["rotary_mul half"] = (lambda: ops.npu_rotary_mul(q, cos, sin), lambda: q * cos + _rot_half(q) * sin)
    tokens = _rand(T, H)
    idx = torch.stack([torch.randperm(E)[:TOPK] for _ in range(T)]).to(NPU)
    probs = torch.rand(T, TOPK, device=NPU)

    def unfused_permute_unpermute():
        order = torch.argsort(idx.reshape(-1), stable=True)
        permuted = tokens.index_select(0, order // TOPK)
        out = torch.zeros(T * TOPK, H, device=NPU).index_copy_(0, order, permuted)
        return (out.view(T, TOPK, H) * probs.unsqueeze(-1)).sum(1)

    def fused_permute_unpermute():
        permuted, si = ops.npu_moe_token_permute(tokens, idx)
        return ops.npu_moe_token_unpermute(permuted, si, probs)

    c["moe permute+unpermute"] = (fused_permute_unpermute, unfused_permute_unpermute)
    counts = torch.bincount(idx.reshape(-1).cpu(), minlength=E).tolist()
    xs, w = _rand(T * TOPK, 256), _rand(E, 256, 512)

    def unfused_gmm():
        return torch.cat([a @ b for a, b in zip(xs.split(counts), w.unbind(0))])

    c["grouped_matmul split M"] = (
        lambda: ops.npu_grouped_matmul([xs], [w], group_list=counts, split_item=3, group_type=0,
                                       group_list_type=1)[0], unfused_gmm)
    dy = _rand(T * TOPK, 512)
    c["grouped_matmul split K (dW)"] = (
        lambda: ops.npu_grouped_matmul([xs.t()], [dy], group_list=counts, split_item=3, group_type=2,
                                       group_list_type=1)[0],
        lambda: torch.stack([a.t() @ b for a, b in zip(xs.split(counts), dy.split(counts))]))
    logits, target = _rand(T, 8192), torch.randint(0, 8192, (T,), device=NPU)
    c["cross_entropy_loss"] = (lambda: ops.npu_cross_entropy_loss(logits, target)[0],
                               lambda: F.cross_entropy(logits, target).reshape(1))
    s, b, n, d = 512, 2, 8, 64
    po, co = _rand(s, b, n * d), _rand(s, b, n * d)
    pm, cm = _rand(b, n, s, 1).repeat(1, 1, 1, 8), _rand(b, n, s, 1).repeat(1, 1, 1, 8)
    ps, cs = torch.rand(b, n, s, 8, device=NPU) + 1, torch.rand(b, n, s, 8, device=NPU) + 1

    def unfused_ring():
        m = torch.maximum(pm, cm)
        a, bb = ps * torch.exp(pm - m), cs * torch.exp(cm - m)
        ssum = a + bb
        wa, wb = (t[..., :1].permute(2, 0, 1, 3) for t in (a / ssum, bb / ssum))
        return (po.unflatten(-1, (n, d)) * wa + co.unflatten(-1, (n, d)) * wb).flatten(-2)

    c["ring_attention_update"] = (lambda: ops.npu_ring_attention_update(po, pm, ps, co, cm, cs)[0], unfused_ring)
    _routing_cases(c)
    return c


def _routing_cases(c):
    """Gating, init_routing_v2, grouped_matmul_finalize_routing, fused_linear_online_max_sum."""
    gate, bias = _rand(T, 256), torch.rand(256, device=NPU)

    def unfused_gating():  # sigmoid, biased top-2-sum groups, 4 of 8 kept, top 8, renormalised
        s = torch.sigmoid(gate)
        grouped = (s + bias).view(T, 8, 32)
        keep = torch.zeros(T, 8, dtype=torch.bool, device=NPU).scatter_(
            1, grouped.topk(2, -1).values.sum(-1).topk(4, -1).indices, True)
        idx = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).flatten(1).topk(8, -1).indices
        w = s.gather(1, idx)
        return w / (w.sum(-1, keepdim=True) + 1e-20)

    c["moe_gating_top_k sigmoid grouped"] = (
        lambda: ops.npu_moe_gating_top_k(gate, 8, bias=bias, k_group=4, group_count=8, group_select_mode=1,
                                         norm_type=1)[0], unfused_gating)
    x = _rand(T, H)
    expert_idx = torch.stack([torch.randperm(E)[:TOPK] for _ in range(T)]).to(NPU, torch.int32)
    c["moe_init_routing_v2"] = (
        lambda: ops.npu_moe_init_routing_v2(x, expert_idx, expert_num=E)[0],
        lambda: x.index_select(0, torch.argsort(expert_idx.reshape(-1), stable=True) // TOPK))
    counts = torch.bincount(expert_idx.reshape(-1).long().cpu(), minlength=E)
    xs, w = _rand(T * TOPK, 256), _rand(E, 256, 512)
    logit, row = torch.rand(T * TOPK, device=NPU), torch.randint(0, T, (T * TOPK,), device=NPU)

    def unfused_finalize():
        y = torch.cat([a @ b for a, b in zip(xs.split(counts.tolist()), w.unbind(0))]) * logit.unsqueeze(-1)
        return torch.zeros(T, 512, device=NPU).index_add_(0, row, y)

    c["grouped_matmul_finalize_routing"] = (
        lambda: ops.npu_grouped_matmul_finalize_routing(xs, w, counts.to(NPU), logit=logit, row_index=row,
                                                        output_bs=T), unfused_finalize)
    hid, vocab, target = _rand(T, H), _rand(4096, H), torch.randint(0, 8192, (T,), device=NPU)

    def unfused_online():
        logits = hid @ vocab.t()
        mx = logits.max(-1).values
        sub = logits - mx.unsqueeze(-1)
        inside = (target >= 0) & (target < 4096)
        pred = torch.where(inside, sub.gather(1, (target * inside).unsqueeze(-1)).squeeze(-1), 0.0)
        return torch.stack([mx, sub.exp().sum(-1), pred])

    c["fused_linear_online_max_sum"] = (
        lambda: torch.stack(ops.npu_fused_linear_online_max_sum(hid, vocab, target, 0, 4096)[:3]), unfused_online)


def _time(fn, iters, backward):
    torch.npu.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        out = fn()
        if backward:
            out.sum().backward()
    torch.npu.synchronize()
    return (time.perf_counter() - t0) / iters


def _fmt(s):
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    torch.manual_seed(0)
    cases = _cases()
    if args.only:
        cases = {k: v for k, v in cases.items() if k in set(args.only.split(","))}
    print(f"| case | unfused | fused | fused / unfused |\n|---|---:|---:|---:|")
    for name, (fused, unfused) in cases.items():
        backward = name.endswith("fwd+bwd")
        torch.testing.assert_close(fused(), unfused(), rtol=1e-4, atol=1e-4)  # same result before timing
        for fn in (fused, unfused):  # warm-up
            _time(fn, 2, backward)
        times = {"fused": [], "unfused": []}
        for r in range(args.rounds):
            order = ("fused", "unfused") if r % 2 == 0 else ("unfused", "fused")
            for side in order:
                times[side].append(_time(fused if side == "fused" else unfused, args.iters, backward))
        f, u = statistics.median(times["fused"]), statistics.median(times["unfused"])
        print(f"| {name} | {_fmt(u)} | {_fmt(f)} | {f / u:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
