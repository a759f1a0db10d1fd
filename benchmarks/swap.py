#!/usr/bin/env python
"""Swap: a plan whose device peak exceeds the emulated capacity, without and with swap.

    python benchmarks/swap.py [--rounds 5] [--steps 6] [--nproc 2]

Launches ``examples/train.py`` under npurun (FSDP over ``--nproc`` ranks) with one plan and four settings:
* ``noswap@small``: no swap on the small capacity -- run once, expected to fail with the out-of-memory error;
* ``noswap@large``: no swap on a capacity it fits in (the reference: peak and step time);
* ``swap@small``: activation swap of every block + optimizer-state swap on the small capacity;
* ``swap@large``: the same swap on the large capacity (the cost of swap alone, without a tight allocator).
The last three run in interleaved rounds (order reversed every other round). Per run: the median step time
of steps 2.. (step 1 includes warm-up) and the peak of ``torch.npu.max_memory_allocated`` on rank 0; the
table gives the median over rounds. It also checks that every step's loss of the swapped runs equals the
reference's. Prints a Markdown table plus the command, commit, date and load average.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "train.py")
MiB = 1 << 20
SMALL, LARGE = 20 * MiB, 256 * MiB

PLAN = """
model: {{dim: 64, n_layers: 6, n_heads: 4, n_kv_heads: 2, ffn_hidden_dim: 256, max_seq_len: 128}}
data: {{seq_len: 128, global_batch_size: 16, micro_batch_size: 4}}
schedule: {{warmup_steps: 2}}
training: {{steps: {steps}, max_grad_norm: 1.0}}
logging: {{log_every: 1, metrics_path: {metrics}, progress_bar: false}}
memory: {{swap: {{activations: {{blocks: {blocks}}}, optimizer_state: {state}}}}}
"""

SETTINGS = {
    "noswap@large": (LARGE, "[]", "false"),
    "swap@small": (SMALL, "['layers.*']", "true"),
    "swap@large": (LARGE, "['layers.*']", "true"),
}


def launch(workdir: str, name: str, capacity: int, blocks: str, state: str, steps: int, nproc: int):
    """(return code, stderr, metrics records of rank 0)."""
    run = os.path.join(workdir, name)
    os.makedirs(run, exist_ok=True)
    metrics = os.path.join(run, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    with open(os.path.join(run, "plan.yaml"), "w") as f:
        f.write(PLAN.format(steps=steps, metrics=metrics, blocks=blocks, state=state))
    # HCCL_BUFFSIZE=1: 2 MiB of communicator buffers (CANN's 200 MB default does not fit the small device)
    env = dict(os.environ, NPUDIST_DEVICE_MEMORY=str(capacity), OMP_NUM_THREADS="1", HCCL_BUFFSIZE="1",
               NPUDIST_DATA_CACHE=os.path.join(workdir, "cache"))
    cmd = [sys.executable, "-m", "npudist.launch", "--nproc", str(nproc), TRAIN, "--config",
           os.path.join(run, "plan.yaml")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=run, timeout=600)
    records = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
    return res.returncode, res.stderr, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="npudist_swap_bench_")
    load_before = os.getloadavg()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    started = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())

    code, err, records = launch(workdir, "noswap_small", SMALL, "[]", "false", 2, args.nproc)
    oom_line = next((ln.split("]: ", 1)[-1] for ln in err.splitlines() if "NPU out of memory" in ln), None)
    if code == 0 or oom_line is None:
        raise SystemExit(f"expected the no-swap run on {SMALL // MiB} MiB to fail with an out-of-memory error "
                         f"(exit {code}):\n{err[-3000:]}")

    times: dict[str, list[float]] = {k: [] for k in SETTINGS}
    peaks: dict[str, list[int]] = {k: [] for k in SETTINGS}
    losses: dict[str, list[list[float]]] = {k: [] for k in SETTINGS}
    t0 = time.time()
    for r in range(args.rounds):
        order = list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]
        for name in order:
            capacity, blocks, state = SETTINGS[name]
            code, err, records = launch(workdir, name.replace("@", "_"), capacity, blocks, state, args.steps,
                                        args.nproc)
            if code != 0:
                raise SystemExit(f"{name} failed (exit {code}):\n{err[-3000:]}")
            times[name].append(statistics.median(rec["step_time_s"] for rec in records[1:]))
            peaks[name].append(max(rec["memory_peak_bytes"] for rec in records))
            losses[name].append([rec["loss"] for rec in records])
    elapsed = time.time() - t0
    reference = losses["noswap@large"][0]
    equal = all(run == reference for runs in losses.values() for run in runs)

    base = statistics.median(times["noswap@large"])
    print(f"command: python benchmarks/swap.py --rounds {args.rounds} --steps {args.steps} --nproc {args.nproc}")
    print(f"commit {commit}, started {started}, load average before "
          f"{load_before[0]:.2f} / after {os.getloadavg()[0]:.2f}, {elapsed:.0f} s of rounds")
    print(f"no swap on {SMALL // MiB} MiB: {oom_line[:160]}...")
    print()
    print("| setting | capacity | peak allocated (rank 0, median) | step time (median of run medians) | vs no swap |")
    print("|---|---|---|---|---|")
    for name in SETTINGS:
        capacity = SETTINGS[name][0]
        t = statistics.median(times[name])
        print(f"| {name} | {capacity / MiB:.0f} MiB | {statistics.median(peaks[name]) / MiB:.2f} MiB | "
              f"{t * 1000:.0f} ms | {t / base:.2f}x |")
    print()
    print(f"every step's loss equal to noswap@large in every run: {equal}")
    print("per-round step times (s): " + "; ".join(f"{k} {[round(x, 3) for x in v]}" for k, v in times.items()))


if __name__ == "__main__":
    main()
