#!/usr/bin/env python
"""Context and expert parallel, measured through npurun and the example plans.

    python benchmarks/cp_ep.py memory     # CP: peak npu memory of rank 0, cp 1 vs cp 2 (ring, Ulysses)
    python benchmarks/cp_ep.py moe        # MoE training step (ep 2 on 2 ranks): npu+hccl vs cpu+gloo

``memory`` trains examples/plans/long_seq_cp.yaml at ``--seq-len`` (one sequence per step, no data
parallelism) on 1 rank (cp 1) and on 2 ranks (cp 2, ring and Ulysses) and reports the median over the steps
after the first of rank 0's ``memory_peak_bytes`` (the npu allocator's peak within the step: weights, FSDP
buffers, activations). ``moe`` trains examples/plans/moe_ep.yaml on 2 ranks (dp_shard 2, ep 2) with
``training.device`` npu (hccl) and cpu (gloo), alternating, and reports the median step time of each.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NPURUN = os.path.join(os.path.dirname(sys.executable), "npurun")


def train(nproc: int, plan: str, overrides: list[str]) -> list[dict]:
    """Per-step metrics of rank 0 of one ``npurun`` training run."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = [NPURUN, "--nproc", str(nproc), os.path.join(ROOT, "examples", "train.py"), "--config",
               os.path.join(ROOT, "examples", "plans", plan), "--logging.metrics_path", metrics,
               "--logging.progress_bar", "false", "--checkpoint.enable_checkpoint", "false", *overrides]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
        return [json.loads(line) for line in open(metrics)]


def steady(records: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in records[1:])


def memory(args) -> None:
    common = ["--data.seq_len", str(args.seq_len), "--model.max_seq_len", str(args.seq_len),
              "--data.global_batch_size", "1", "--data.micro_batch_size", "1", "--training.steps", str(args.steps),
              "--parallel.dp_shard_degree", "1"]
    rows = [("cp 1", train(1, "long_seq_cp.yaml", common + ["--parallel.cp_degree", "1"]))]
    for method in ("ring", "ulysses"):
        rows.append((f"cp 2 {method}", train(2, "long_seq_cp.yaml", common + [
            "--parallel.cp_degree", "2", "--parallel.cp.method", method])))
    base = steady(rows[0][1], "memory_peak_bytes")
    print(f"sequence {args.seq_len} tokens, 1 sequence per step, {args.steps} steps (median after the first)")
    for name, records in rows:
        peak = steady(records, "memory_peak_bytes")
        print(f"  {name:<13} peak {peak / 2**20:8.1f} MiB  ({peak / base:.2f} of cp 1)  "
              f"step {steady(records, 'step_time_s'):.2f} s  loss {records[-1]['loss']:.4f}")


def moe(args) -> None:
    common = ["--training.steps", str(args.steps), "--parallel.dp_shard_degree", "2", "--parallel.ep_degree", "2",
              "--data.global_batch_size", "8", "--data.micro_batch_size", "4"]
    times: dict[str, list[float]] = {"npu": [], "cpu": []}
    for _ in range(args.rounds):
        for device in ("npu", "cpu"):
            records = train(2, "moe_ep.yaml", common + ["--training.device", device])
            times[device].append(steady(records, "step_time_s"))
    npu, cpu = statistics.median(times["npu"]), statistics.median(times["cpu"])
    print(f"moe_ep.yaml on 2 ranks (dp_shard 2, ep 2), {args.steps} steps x {args.rounds} rounds, median step time:")
    print(f"  npu+hccl {npu:.3f} s   cpu+gloo {cpu:.3f} s   npu speed-up {cpu / npu:.2f}x")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("memory", "moe"))
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    memory(args) if args.what == "memory" else moe(args)


if __name__ == "__main__":
    main()
