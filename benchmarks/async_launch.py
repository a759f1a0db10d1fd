#!/usr/bin/env python
"""Asynchronous launch: how long a loop of 30 steps on 1024x1024 fp32 takes to *return*, relative to the
time until its results are ready (torch.npu.synchronize), with launch on (default) and with
ASCEND_LAUNCH_BLOCKING=1. The steps (--loop): `y = y @ w` (chain), `y = y @ w / 1024` (div) and
`y = torch.relu(y @ w)` (relu), and a transformer block's training step (block: forward, backward, SGD update;
--block-steps of them, 10 by default); by default all four. Ten block steps fit the default launch queue
(NPUDIST_LAUNCH_QUEUE_DEPTH, 1024 kernels per stream, docs/device.md); thirty do not, and then the host waits for
the queue as it would for a device's.

    python benchmarks/async_launch.py [--rounds 7] [--chain 30] [--block-steps 10] [--size 1024] [--loop ...]
    python benchmarks/async_launch.py --per-op [--rounds 7] [--ops 3000]

Each mode runs in its own process (the variable is read once per process); both processes are driven in
alternating rounds, so machine noise hits both alike. Reported per mode and loop: median loop time, median
time to synchronize, their ratio, and the peak of torch.npu.max_memory_allocated over a loop. Targets: async
ratio < 0.05 (the loop returns long before the work is done), blocking ratio ~1.0, results bitwise equal in
both modes (a digest of the final y's bytes) and the async peak no higher than the blocking one.

--per-op measures instead what one small op costs end to end (a loop of 3000 ops on 64x64 fp32, then a
synchronize; per op): elementwise add and matmul, on npu in each launch mode and on cpu in the same worker
(the baseline). A queued launch pays for the launch path on the host and the task on the stream's worker;
the two overlap, so the per-op time is the slower of them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--chain", type=int, default=30, help="steps per matmul loop (chain, div, relu)")
    ap.add_argument("--block-steps", type=int, default=10, help="steps per block loop")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--loop", nargs="+", choices=sorted(LOOPS), default=["chain", "div", "relu", "block"])
    ap.add_argument("--per-op", action="store_true", help="cost per small op (add, mm) instead of the matmul chain")
    ap.add_argument("--ops", type=int, default=3000, help="ops per timed loop (--per-op)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (--per-op); 0: torch's default (one per core)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if "block" in args.loop and (args.size * args.size) % (256 * 256):
        ap.error(f"--loop block runs 256-token sequences of width 256 over y: --size {args.size} squared must be a "
                 "multiple of 65536 (e.g. 256, 512, 1024)")
    return args


# --per-op: (a 64x64 fp32 pair: a tiny op, or a 256x256 pair: a 256 KiB add) -> op
PER_OP = {"add": (64, lambda a, b: a + b), "mm": (64, lambda a, b: a @ b), "add_256k": (256, lambda a, b: a + b)}
_BLOCK = {}


def _reset_block() -> None:
    """A fresh transformer block from a fixed seed before each timed block loop: every round of both modes starts
    from the same weights, so their final outputs can be compared bit for bit."""
    import torch
    torch.manual_seed(1)
    _BLOCK["block"] = torch.nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0,
                                                       batch_first=True).to("npu")
    torch.npu.synchronize()


def _block_step(y, w):
    """One training step of a transformer block (d_model 256, 4 heads, batch of y's rows as 256-token sequences):
    forward, backward and an SGD update, so the next step's output depends on every gradient (the digest of the
    final y then covers the backward too)."""
    import torch
    if "block" not in _BLOCK:
        _reset_block()
    block = _BLOCK["block"]
    x = y.reshape(-1, 256, 256)
    out = block(x)
    out.square().mean().backward()
    with torch.no_grad():
        for p in block.parameters():
            p -= 1e-3 * p.grad
            p.grad = None
    return out.detach().reshape(y.shape)


LOOPS = {"chain": lambda y, w: y @ w, "div": lambda y, w: y @ w / 1024, "relu": lambda y, w: (y @ w).relu(),
         "block": _block_step}


def per_op_worker(args) -> None:
    """--per-op: per round, microseconds per op for each op on npu (this process's launch mode) and on cpu."""
    import torch
    import npudist  # noqa: F401
    if args.threads:
        torch.set_num_threads(args.threads)
    operands = {(dev, n): (torch.randn(n, n, device=dev), torch.randn(n, n, device=dev))
                for dev in ("npu", "cpu") for n in (64, 256)}

    def time_loop(dev, op):
        n, fn = op
        a, b = operands[(dev, n)]
        t0 = time.perf_counter()
        for _ in range(args.ops):
            fn(a, b)
        if dev == "npu":
            torch.npu.synchronize()
        return (time.perf_counter() - t0) / args.ops * 1e6

    devices = ("npu", "cpu")
    for dev in devices:  # warm-up: first runs of each signature, allocator, BLAS
        for op in PER_OP.values():
            time_loop(dev, op)
    for _ in sys.stdin:
        out = {f"{dev}_{name}": time_loop(dev, op) for name, op in PER_OP.items() for dev in devices}
        print(json.dumps(out), flush=True)


def worker(args) -> None:
    """Reads one line per round from stdin, answers with the round's timings as JSON."""
    import torch
    import npudist  # noqa: F401
    if args.per_op:
        per_op_worker(args)
        return
    import hashlib
    torch.manual_seed(0)
    w = torch.randn(args.size, args.size, device="npu") / args.size ** 0.5
    for name in args.loop:  # warm-up: first runs of each signature, BLAS init, allocator
        LOOPS[name](w, w)
    torch.npu.synchronize()
    for _ in sys.stdin:
        out = {"blocking": torch.npu.launch.is_blocking()}
        for name in args.loop:
            step = LOOPS[name]
            if name == "block":
                _reset_block()
            torch.npu.reset_peak_memory_stats()
            t0 = time.perf_counter()
            y = w
            for _ in range(args.block_steps if name == "block" else args.chain):
                y = step(y, w)
            t_loop = time.perf_counter() - t0
            torch.npu.synchronize()
            t_sync = time.perf_counter() - t0
            digest = hashlib.sha1(y.cpu().numpy().tobytes()).hexdigest()
            out[name] = {"loop": t_loop, "sync": t_sync, "peak": torch.npu.max_memory_allocated(), "digest": digest}
            del y
        print(json.dumps(out), flush=True)


def main(argv=None) -> int:
    args = _args(argv)
    if args.worker:
        worker(args)
        return 0
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--chain", str(args.chain), "--size", str(args.size),
           "--block-steps", str(args.block_steps), "--ops", str(args.ops), "--threads", str(args.threads),
           "--loop", *args.loop] + (["--per-op"] if args.per_op else [])
    sys.path.insert(0, HERE)
    from _alternate import alternate
    times = alternate({mode: (cmd, dict(os.environ, ASCEND_LAUNCH_BLOCKING=blocking, NPUDIST_LAUNCH_BLOCKING=blocking))
                       for mode, blocking in (("async", "0"), ("blocking", "1"))}, args.rounds)
    if args.per_op:
        report_per_op(args, times)
        return 0
    print(f"loops of {args.chain} steps (block: {args.block_steps}) on {args.size}x{args.size} fp32 on npu, "
          f"{args.rounds} alternating rounds (medians); load average {os.getloadavg()[0]:.2f}")
    ok = True
    for name in args.loop:
        ratios, peaks, digests = {}, {}, {}
        for mode, ts in times.items():
            rs = [t[name] for t in ts]
            loop = statistics.median(r["loop"] for r in rs)
            sync = statistics.median(r["sync"] for r in rs)
            ratios[mode] = statistics.median(r["loop"] / r["sync"] for r in rs)
            peaks[mode] = max(r["peak"] for r in rs)
            digests[mode] = {r["digest"] for r in rs}
            print(f"  {name:<6} {mode:<9} loop returns {loop * 1e3:8.1f} ms   results ready {sync * 1e3:8.1f} ms   "
                  f"loop/ready = {ratios[mode]:.3f}   peak {peaks[mode] / 2**20:6.1f} MiB")
        equal = len(digests["async"] | digests["blocking"]) == 1
        passed = ratios["async"] < 0.05 and ratios["blocking"] > 0.9 and equal and peaks["async"] <= peaks["blocking"]
        print(f"  {name:<6} async loop/ready {ratios['async']:.3f} (target < 0.05), blocking {ratios['blocking']:.3f} "
              f"(~1.0), results {'bitwise equal' if equal else 'DIFFER'}, peak async/blocking "
              f"{peaks['async'] / peaks['blocking']:.2f} (target <= 1): {'PASS' if passed else 'FAIL'}")
        ok &= passed
    return 0 if ok else 1


def report_per_op(args, times) -> None:
    threads = args.threads or f"torch's default ({os.cpu_count()})"
    print(f"microseconds per op (add, mm: 64x64 fp32; add_256k: 256x256 fp32), loops of {args.ops} ops then "
          f"synchronize; {args.rounds} alternating "
          f"rounds (medians); intra-op threads {threads}; load average {os.getloadavg()[0]:.2f}")
    print(f"  {'op':<8} {'npu async':>10} {'npu blocking':>13} {'cpu':>7}   async/cpu  blocking/cpu  async/blocking")
    for name in PER_OP:
        med = {mode: statistics.median(t[f"npu_{name}"] for t in ts) for mode, ts in times.items()}
        cpu = statistics.median(t[f"cpu_{name}"] for ts in times.values() for t in ts)
        print(f"  {name:<8} {med['async']:10.2f} {med['blocking']:13.2f} {cpu:7.2f}   {med['async'] / cpu:9.2f}x "
              f"{med['blocking'] / cpu:12.2f}x {med['async'] / med['blocking']:14.2f}x")


if __name__ == "__main__":
    sys.exit(main())
