"""npu vs cpu: what the zero-copy device costs over running the same CPU kernels directly.

Large ops (2048x2048 matmul, 4M-element elementwise), the 3x3 convolution of a ResNet basic block
(64 channels, 56x56, batch 8; forward, and forward + backward) and tiny ops (100 elements), measured side
by side: the two sides are interleaved in rounds and medians reported, so machine noise hits both alike.
Targets: large ops within 1.05x of cpu, ResNet-block conv2d within 1.10x;
tiny-op added overhead under 5 us. Each timed loop ends with torch.npu.synchronize(), so in the default
asynchronous launch mode it measures the kernels' completion, not only their queueing.

    .venv/bin/python benchmarks/device_overhead.py [--rounds 7]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import npudist  # noqa: F401  (registers the npu device)


def _no_grad(module, x):
    with torch.no_grad():
        return module(x)


def _time_per_call(fn, iters: int) -> float:
    # Launch is asynchronous by default: the time of an npu loop ends when its kernels have run, not when the
    # host has queued them (torch.npu.synchronize; a no-op cost for the cpu side).
    fn()  # warm-up (allocator caches, dispatcher)
    torch.npu.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.npu.synchronize()
    return (time.perf_counter() - t0) / iters


def _cases():
    big_a = torch.randn(2048, 2048)
    big_b = torch.randn(2048, 2048)
    e1 = torch.randn(4 << 20)
    e2 = torch.randn(4 << 20)
    t1 = torch.randn(100)
    t2 = torch.randn(100)
    act = torch.randn(8, 64, 56, 56)  # ResNet-18/34 stage-1 basic block activation
    conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False)
    cases = []
    for dev in ("cpu", "npu"):
        a, b, x, y, s, u = (t.to(dev) for t in (big_a, big_b, e1, e2, t1, t2))
        xi = x.clone()
        si = s.clone()
        c = copy.deepcopy(conv).to(dev)
        h = act.to(dev)
        hg = h.clone().requires_grad_(True)
        cases.append({
            "conv2d block fwd": (lambda c=c, h=h: _no_grad(c, h), 3),
            "conv2d block fwd+bwd": (lambda c=c, hg=hg: c(hg).sum().backward(), 2),
            "matmul 2048^2": (lambda a=a, b=b: torch.mm(a, b), 3),
            "add 4M": (lambda x=x, y=y: torch.add(x, y), 20),
            "add_ 4M (in-place)": (lambda xi=xi, y=y: xi.add_(y), 20),
            "mul+sum 4M": (lambda x=x, y=y: (x * y).sum(), 10),
            "tiny add (100)": (lambda s=s, u=u: torch.add(s, u), 2000),
            "tiny add_ (100)": (lambda si=si, u=u: si.add_(u), 2000),
            "tiny relu (100)": (lambda s=s: torch.relu(s), 2000),
            "tiny view+index": (lambda s=s: s.view(10, 10)[3], 2000),
        })
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per case (median reported)")
    args = ap.parse_args()
    cpu_cases, npu_cases = _cases()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} interleaved rounds")
    print(f"{'case':<22}{'cpu':>12}{'npu':>12}{'ratio':>8}{'added':>12}")
    for name in cpu_cases:
        fc, iters = cpu_cases[name]
        fn, _ = npu_cases[name]
        tc, tn = [], []
        for r in range(args.rounds):
            order = ((fc, tc), (fn, tn)) if r % 2 == 0 else ((fn, tn), (fc, tc))
            for f, acc in order:
                acc.append(_time_per_call(f, iters))
        mc, mn = statistics.median(tc), statistics.median(tn)
        added_us = (mn - mc) * 1e6
        print(f"{name:<22}{_fmt(mc):>12}{_fmt(mn):>12}{mn / mc:>7.3f}x{added_us:>10.2f}us")


def _fmt(sec: float) -> str:
    return f"{sec * 1e3:.3f}ms" if sec >= 1e-3 else f"{sec * 1e6:.2f}us"


if __name__ == "__main__":
    main()
