#!/usr/bin/env python
"""Context and expert parallel, measured through npurun and the example plans.

    python benchmarks/cp_ep.py memory     # CP: peak npu memory of rank 0, cp 1 vs cp 2 (ring, Ulysses)
    python benchmarks/cp_ep.py moe        # MoE training step (ep 2 on 2 ranks): npu+hccl vs cpu+gloo
    python benchmarks/cp_ep.py ring       # ring attention fwd+bwd on 2 ranks: overlapped vs serial exchange
    python benchmarks/cp_ep.py ep-tp      # MoE on 4 ranks: ep 2 x FSDP 4 vs ep 2 x FSDP 2 x TP 2

``memory`` trains examples/plans/long_seq_cp.yaml at ``--seq-len`` (one sequence per step, no data
parallelism) on 1 rank (cp 1) and on 2 ranks (cp 2, ring and Ulysses) and reports the median over the steps
after the first of rank 0's ``memory_peak_bytes`` (the npu allocator's peak within the step: weights, FSDP
buffers, activations). ``moe`` trains examples/plans/moe_ep.yaml on 2 ranks (dp_shard 2, ep 2) with
``training.device`` npu (hccl) and cpu (gloo), alternating, and reports the median step time of each.
``ring`` runs npudist.cp's ring attention (forward + backward, one [1, heads, seq/2, 64] shard per rank) under
``npurun --nproc 2`` on npu + hccl, alternating between the ring as it is (each block's send/recv in flight
during the current block's attention) and the same ring waiting for every transfer right after issuing it,
and reports the median time per forward + backward of each. ``ep-tp`` trains moe_ep.yaml (dp_shard 4, ep 2)
and moe_ep_tp.yaml (dp_shard 2 x tp 2, ep 2, sequence parallel) on 4 ranks, alternating, and reports the
median step time and rank 0's peak npu memory of each.
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


def ep_tp(args) -> None:
    common = ["--training.steps", str(args.steps)]
    rows: dict[str, list[tuple[float, float, float]]] = {"moe_ep.yaml": [], "moe_ep_tp.yaml": []}
    for _ in range(args.rounds):
        for plan in rows:
            records = train(4, plan, common)
            rows[plan].append((steady(records, "step_time_s"), steady(records, "memory_peak_bytes"),
                               records[-1]["loss"]))
    print(f"moe model on 4 ranks, {args.steps} steps x {args.rounds} rounds (median after the first step):")
    for plan, runs in rows.items():
        print(f"  {plan:<15} step {statistics.median(r[0] for r in runs):.3f} s  peak of rank 0 "
              f"{statistics.median(r[1] for r in runs) / 2**20:.1f} MiB  loss at the last step {runs[-1][2]:.4f}")


def ring(args) -> None:
    cmd = [NPURUN, "--nproc", "2", os.path.abspath(__file__), "ring-worker", "--seq-len", str(args.seq_len),
           "--steps", str(args.steps), "--rounds", str(args.rounds), "--heads", str(args.heads)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    print("\n".join(line.split("]: ", 1)[-1] for line in done.stdout.splitlines() if "[rank0]" in line))


def ring_worker(args) -> None:
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from npudist.cp import SequenceSharder
    from npudist.cp.core import ContextParallelAttention, RingExchange, _RingAttention

    class SerialExchange(RingExchange):
        """The same ring, but each transfer completes before the attention that could hide it."""

        def start(self, tensor):
            return RingExchange.wait(super().start(tensor)), []

    torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("hccl")
    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("cp",))
    sharder = SequenceSharder(mesh)
    cp = ContextParallelAttention(sharder, "ring")
    local = args.seq_len // 2
    masks, dead = cp._masks(local, torch.device("npu"))
    q, k, v = (torch.randn(1, args.heads, local, 64, device="npu", requires_grad=True) for _ in range(3))
    grad = torch.randn(1, args.heads, local, 64, device="npu")
    times: dict[str, list[float]] = {"overlapped": [], "serial": []}
    for _ in range(args.rounds):
        for name, cls in (("overlapped", RingExchange), ("serial", SerialExchange)):
            exchange = cls(sharder.group, sharder.rank, sharder.size)
            for i in range(args.steps + 1):
                dist.barrier()
                torch.npu.synchronize()
                start = time.perf_counter()
                _RingAttention.apply(q, k, v, exchange, masks, dead).backward(grad)
                torch.npu.synchronize()
                if i:   # the first is a warm-up
                    times[name].append(time.perf_counter() - start)
    dist.destroy_process_group()
    if sharder.rank == 0:
        over, serial = statistics.median(times["overlapped"]), statistics.median(times["serial"])
        print(f"ring attention fwd+bwd, cp 2, {args.seq_len} tokens x {args.heads} heads x 64, "
              f"{args.steps} x {args.rounds} rounds, median: overlapped {over * 1e3:.1f} ms, serial "
              f"{serial * 1e3:.1f} ms ({serial / over:.2f}x)", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("memory", "moe", "ring", "ring-worker", "ep-tp"))
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    {"memory": memory, "moe": moe, "ring": ring, "ring-worker": ring_worker, "ep-tp": ep_tp}[args.what](args)


if __name__ == "__main__":
    main()
