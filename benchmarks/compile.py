"""torch.compile on npu vs cpu, eager and compiled, four variants interleaved in rounds.

Two workloads:
  - default: one Llama ``TransformerBlock`` training step (forward + backward, ``torch.compile`` of the step);
  - ``--plan``: a compiled training step from a plan: the plan's Llama (``--layers`` blocks), its
    ``parallelize`` (one process, no parallelism) and ``train_step`` (AdamW, clipping), with
    ``compile: {enable: true}`` (every block and the loss through Inductor, fullgraph) for the compiled variants.

The four variants -- cpu eager, cpu compiled, npu eager, npu compiled -- run side by side, interleaved in rounds
(the order reversed every other round, medians reported), so machine noise hits all alike. Compilation happens
in the untimed warm-up, into a fresh Inductor cache directory (``tempfile.mkdtemp``, removed at the end): a cache
filled by another build is never read. Printed ratios, each the median of the per-round ratios:
  - compiled npu / compiled cpu: speed (cpu_compiled_time / npu_compiled_time); target >= 0.95x,
  - npu speedup / cpu speedup, where speedup = eager / compiled step time per device.
``--plan`` also prints every variant's final loss (all train the same steps on the same data from the same
initial weights) and the largest relative difference from cpu eager, and exits with status 1 beyond fp32 noise.
With --cache it times the first compiled block step of a fresh process twice over one FX-graph cache directory
(cold: empty cache; warm: the second process reuses the first one's compiled graphs).

    .venv/bin/python benchmarks/compile.py [--rounds 7] [--dim 256] [--seq 128] [--batch 4] [--cache]
    .venv/bin/python benchmarks/compile.py --plan [--rounds 7] [--dim 256] [--layers 2] [--seq 128] [--batch 4]
"""
from __future__ import annotations

import argparse
import copy
import os
import shutil
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

DEVICES = ("cpu", "npu")
# Largest relative difference of a final loss from cpu eager's that --plan accepts: compiled kernels sum in
# another order than eager ones, and AdamW carries those fp32 rounding differences from step to step.
LOSS_RTOL = 1e-4


def _make_step(block, x, cos, sin, compiled: bool):
    def step():
        out = block(x, cos, sin)
        out.square().mean().backward()

    if compiled:
        step = torch.compile(step)
    return step


def _block_variants(args):
    torch.manual_seed(0)
    margs = ModelConfig(dim=args.dim, n_heads=args.heads, max_seq_len=args.seq)
    base = TransformerBlock(0, margs)
    base.init_weights()
    cos, sin = compute_rope_cache(margs.head_dim, margs.max_seq_len, margs.rope_theta)
    x = torch.randn(args.batch, args.seq, args.dim)
    variants = {}
    for dev in DEVICES:
        for compiled in (False, True):
            block = copy.deepcopy(base).to(dev)
            step = _make_step(block, x.to(dev), cos.to(dev), sin.to(dev), compiled)
            variants[(dev, compiled)] = step
    return variants


class _PlanStep:
    """One variant of ``--plan``: the plan's model, optimizer and data on ``device``; calling it runs one
    ``train_step`` and keeps its loss. Every variant builds the same initial weights (same seed) and reads the
    same batches, so their final losses are comparable."""

    def __init__(self, args, device: str, compiled: bool, corpus: str):
        from npudist.data import TextDataset
        from npudist.models import build_model
        from npudist.parallelize import parallelize
        from npudist.plan import (CompileConfig, DataConfig, ModelConfig as PlanModel, OptimizerConfig, Plan,
                                  ScheduleConfig, TrainingConfig)
        from npudist.train.optim import build_lr_scheduler, build_optimizer

        self.plan = Plan(
            model=PlanModel(vocab_size=256, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                            ffn_hidden_dim=args.dim * 8 // 3 // 64 * 64, max_seq_len=args.seq),
            data=DataConfig(path=corpus, seq_len=args.seq, global_batch_size=args.batch,
                            micro_batch_size=args.batch),
            optimizer=OptimizerConfig(lr=1e-3),
            schedule=ScheduleConfig(warmup_steps=0, decay="constant"),
            training=TrainingConfig(steps=10**6, seed=0, max_grad_norm=1.0, device=device),
            compile=CompileConfig(enable=compiled),
        )
        torch.manual_seed(0)
        self.pm = parallelize(build_model(self.plan.model), self.plan, None)
        self.opt = build_optimizer(list(self.pm.named_parameters()), self.plan.optimizer)
        self.sched = build_lr_scheduler(self.opt, self.plan.schedule, self.plan.training.steps)
        self.data = TextDataset(corpus, args.seq, args.batch)
        self.loss = float("nan")

    def __call__(self) -> None:
        from npudist.train.step import train_step
        self.loss, _ = train_step(self.pm, self.opt, self.sched, [self.data.next_batch()],
                                  self.plan.training.max_grad_norm)


def _plan_variants(args):
    from npudist.data import default_corpus_path
    corpus = default_corpus_path()
    return {(dev, compiled): _PlanStep(args, dev, compiled, corpus) for dev in DEVICES for compiled in (False, True)}


def _time(step, iters: int) -> float:
    # npu ops return once their kernels are queued (asynchronous launch), and an eager block step ends with
    # queued work: drain before and after, so a variant's time is its own and includes all of its kernels.
    torch.npu.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    torch.npu.synchronize()
    return (time.perf_counter() - t0) / iters


def _measure(variants, rounds: int, iters: int) -> dict:
    """Seconds per step of every variant, one entry per round; the rounds interleave the variants."""
    for step in variants.values():  # compile + warm up (allocator caches, autograd, optimizer state)
        step()
        step()
    times = {key: [] for key in variants}
    order = list(variants)
    for r in range(rounds):
        for key in order if r % 2 == 0 else order[::-1]:  # alternate the order so no variant always runs first
            times[key].append(_time(variants[key], iters))
    return times


def _report(times) -> None:
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"{'device':<8}{'eager ms':>10}{'compiled ms':>13}{'speedup':>9}")
    for dev in DEVICES:
        e, c = med[(dev, False)], med[(dev, True)]
        print(f"{dev:<8}{e * 1e3:>10.2f}{c * 1e3:>13.2f}{e / c:>8.2f}x")
    # Ratios per round, then their median: both sides of a ratio ran back to back, so load that drifts between
    # rounds cancels (a ratio of medians mixes rounds).
    def per_round(num, den):
        return statistics.median(a / b for a, b in zip(num, den))

    speedup = {dev: [e / c for e, c in zip(times[(dev, False)], times[(dev, True)])] for dev in DEVICES}
    print(f"npu speedup / cpu speedup: {per_round(speedup['npu'], speedup['cpu']):.2f}x")
    print(f"compiled npu / compiled cpu: {per_round(times[('cpu', True)], times[('npu', True)]):.2f}x  "
          f"(speed; target >= 0.95x)")


def _check_losses(variants) -> bool:
    """Print every variant's final loss; True when all are within LOSS_RTOL of cpu eager's."""
    ref = variants[("cpu", False)].loss
    worst = max(abs(v.loss - ref) / abs(ref) for v in variants.values())
    print("final loss: " + ", ".join(f"{dev} {'compiled' if c else 'eager'} {v.loss:.8g}"
                                     for (dev, c), v in variants.items()))
    print(f"largest relative difference from cpu eager: {worst:.1e} (accepted: {LOSS_RTOL:.0e})")
    return worst <= LOSS_RTOL


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="store_true", help="a training step from a plan instead of one block's step")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median reported)")
    ap.add_argument("--iters", type=int, default=5, help="steps per variant per round")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2, help="--plan: transformer blocks")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--cache", action="store_true", help="also time the first step with a cold and a warm cache")
    args = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # Read by Inductor at each cache access, so setting it before the first compile is enough.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="npudist-inductor-")
    if args.threads:
        torch.set_num_threads(args.threads)
    what = (f"training step from a plan: Llama dim={args.dim} layers={args.layers} heads={args.heads}, AdamW"
            if args.plan else f"TransformerBlock dim={args.dim} heads={args.heads}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {what} seq={args.seq} batch={args.batch}; "
          f"{args.rounds} rounds x {args.iters} steps; load average {os.getloadavg()[0]:.2f}")
    ok = True
    try:
        variants = _plan_variants(args) if args.plan else _block_variants(args)
        _report(_measure(variants, args.rounds, args.iters))
        if args.plan:
            ok = _check_losses(variants)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.cache:
        _first_step_times(args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
