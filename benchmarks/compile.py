"""torch.compile on npu vs cpu: a Llama transformer block's training step (fwd + bwd), eager and compiled.

Four variants are measured side by side, interleaved in rounds (medians reported), so machine noise hits all
alike: cpu eager, cpu compiled, npu eager, npu compiled. Printed ratios:
  - speedup = eager / compiled step time, per device; targets: npu speedup >= 0.9x cpu speedup,
  - compiled npu speed vs compiled cpu speed (cpu_compiled_time / npu_compiled_time) >= 0.9x;
each ratio is the median of the per-round ratios.
With --cache it also times the first compiled step of a fresh process twice over one FX-graph cache directory
(cold: empty cache; warm: the second process reuses the first one's compiled graphs).

    .venv/bin/python benchmarks/compile.py [--rounds 7] [--dim 256] [--seq 128] [--batch 4] [--cache]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import npudist  # noqa: F401  (registers the npu device)
from npudist.models.llama import TransformerBlock
from npudist.plan.schema import ModelConfig
from npudist.models.llama import compute_rope_cache


def _make_step(block, x, cos, sin, compiled: bool):
    def step():
        out = block(x, cos, sin)
        out.square().mean().backward()

    if compiled:
        step = torch.compile(step)
    return step


def _variants(args):
    torch.manual_seed(0)
    margs = ModelConfig(dim=args.dim, n_heads=args.heads, max_seq_len=args.seq)
    base = TransformerBlock(0, margs)
    base.init_weights()
    cos, sin = compute_rope_cache(margs.head_dim, margs.max_seq_len, margs.rope_theta)
    x = torch.randn(args.batch, args.seq, args.dim)
    variants = {}
    for dev in ("cpu", "npu"):
        for compiled in (False, True):
            block = copy.deepcopy(base).to(dev)
            step = _make_step(block, x.to(dev), cos.to(dev), sin.to(dev), compiled)
            variants[(dev, compiled)] = step
    return variants


def _time(step, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t0) / iters


_FIRST_STEP_CHILD = r"""
import sys, time
t0 = time.perf_counter()
import torch, npudist
from npudist.models.llama import TransformerBlock
from npudist.plan.schema import ModelConfig
from npudist.models.llama import compute_rope_cache
dim, heads, seq, batch = (int(a) for a in sys.argv[1:5])
a = ModelConfig(dim=dim, n_heads=heads, max_seq_len=seq)
block = TransformerBlock(0, a).npu()
cos, sin = (t.npu() for t in compute_rope_cache(a.head_dim, seq, a.rope_theta))
x = torch.randn(batch, seq, dim, device="npu")
t1 = time.perf_counter()
torch.compile(lambda: block(x, cos, sin).square().mean().backward())()
t2 = time.perf_counter()
hits = torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"]
print(f"{t2 - t1:.3f} {t2 - t0:.3f} {hits}")
"""


def _first_step_times(args) -> None:
    with tempfile.TemporaryDirectory(prefix="npudist-inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_COMPILE_THREADS="1")
        for label in ("cold", "warm"):
            out = subprocess.run(
                [sys.executable, "-c", _FIRST_STEP_CHILD, str(args.dim), str(args.heads), str(args.seq),
                 str(args.batch)], env=env, capture_output=True, text=True, check=True).stdout.split()
            step, total, hits = float(out[0]), float(out[1]), int(out[2])
            print(f"time to first compiled step, {label} cache: {step:7.2f} s "
                  f"(process start to first step {total:.2f} s, FX graph cache hits {hits})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median reported)")
    ap.add_argument("--iters", type=int, default=5, help="steps per variant per round")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--cache", action="store_true", help="also time the first step with a cold and a warm cache")
    args = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; TransformerBlock dim={args.dim} "
          f"heads={args.heads} seq={args.seq} batch={args.batch}; {args.rounds} rounds x {args.iters} steps")
    variants = _variants(args)
    for key, step in variants.items():  # compile + warm up (allocator caches, autograd)
        step()
        step()
    times = {key: [] for key in variants}
    order = list(variants)
    for r in range(args.rounds):
        for key in order if r % 2 == 0 else order[::-1]:  # alternate the order so no variant always runs first
            times[key].append(_time(variants[key], args.iters))
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"{'device':<8}{'eager ms':>10}{'compiled ms':>13}{'speedup':>9}")
    for dev in ("cpu", "npu"):
        e, c = med[(dev, False)], med[(dev, True)]
        print(f"{dev:<8}{e * 1e3:>10.2f}{c * 1e3:>13.2f}{e / c:>8.2f}x")
    # Ratios per round, then their median: both sides of a ratio ran back to back, so load that drifts between
    # rounds cancels (a ratio of medians mixes rounds).
    def per_round(num, den):
        return statistics.median(a / b for a, b in zip(num, den))

    speedup = {dev: [e / c for e, c in zip(times[(dev, False)], times[(dev, True)])] for dev in ("cpu", "npu")}
    print(f"npu speedup / cpu speedup: {per_round(speedup['npu'], speedup['cpu']):.2f}x  (target >= 0.9x)")
    print(f"compiled npu speed / compiled cpu speed: {per_round(times[('cpu', True)], times[('npu', True)]):.2f}x  "
          f"(target >= 0.9x)")
    if args.cache:
        _first_step_times(args)


if __name__ == "__main__":
    main()
