#!/usr/bin/env python
"""Peak device memory under asynchronous launch against ASCEND_LAUNCH_BLOCKING=1, for the main job and the
training parity layouts.

    python benchmarks/launch_memory.py                       # main job + every parity layout of <= 4 ranks
    python benchmarks/launch_memory.py --runs main,pp2_1f1b  # a subset
    python benchmarks/launch_memory.py --steps 6             # the main job's step count (parity plans keep theirs)

Every run is ``--rounds`` pairs of ``npurun`` jobs of this file's rank worker, one per launch mode, the two modes
alternating (which goes first flips every round) so machine load hits both. The rank worker
trains the plan with ``npudist.train.trainer.run`` -- what ``examples/train.py`` calls -- so the main job is
README's ``npurun --nproc 4 examples/train.py --config examples/plans/fsdp_tp.yaml`` with ``--training.steps``
overridden, and a parity layout is the plan tests/training/test_parity.py builds for it (``make_plan``),
written as a plan file (``plan_yaml``).

Peak: the trainer opens one peak window per step (``reset_peak_memory`` before the step); the worker reads
``torch.npu.max_memory_allocated()`` as each window closes, on every rank. A run's peak is the maximum over
ranks and steps, in both modes alike; a mode's peak is the median over its rounds (``summarize``). The run
passes when async / blocking <= 1 and the per-step losses are identical in every job; the script prints them
and ends with one PASS or FAIL line.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MAIN_PLAN = os.path.join(ROOT, "examples", "plans", "fsdp_tp.yaml")
MAX_RANKS = 4   # the parity layouts the suite runs by default; more ranks than that on 2 cores is too slow


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="all", help="comma-separated: main and/or parity layout names (default all)")
    ap.add_argument("--steps", type=int, default=6, help="the main job's steps (--training.steps)")
    ap.add_argument("--rounds", type=int, default=3, help="jobs per mode and run, the modes alternating (default 3)")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds per npurun job before it is killed")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    return ap.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the rank worker (under npurun) ------------------------------------------------------------------------

def rank_worker(out_prefix: str, argv: list[str]) -> None:
    """Train the plan of ``--config`` (plus overrides) and write this rank's per-step peaks and losses."""
    import torch

    import npudist.train.trainer as trainer
    from npudist.plan import load_plan, parse_overrides
    from npudist.train.metrics import reset_peak_memory

    overrides, rest = parse_overrides(argv)
    config = rest[rest.index("--config") + 1]
    plan = load_plan(config, overrides, world_size=int(os.environ["WORLD_SIZE"]))
    peaks: list[int] = []
    opened = [False]

    def close_window_then_reset(device) -> None:
        # Called by the trainer before each step: the window it closes is the previous step's.
        if opened[0]:
            peaks.append(int(torch.npu.max_memory_allocated(device)))
        opened[0] = True
        reset_peak_memory(device)

    trainer.reset_peak_memory = close_window_then_reset
    result = trainer.run(plan)
    peaks.append(int(torch.npu.max_memory_allocated()))   # the last step's window
    rank = int(os.environ["RANK"])
    with open(f"{out_prefix}.{rank}", "w") as f:
        json.dump({"rank": rank, "peaks": peaks, "losses": result.losses}, f)


# ---- the driver --------------------------------------------------------------------------------------------

def parity_layouts() -> dict:
    sys.path.insert(0, os.path.join(ROOT, "tests", "training"))
    from test_parity import LAYOUTS
    return {name: (world, kw) for name, (world, kw) in LAYOUTS.items() if world <= MAX_RANKS}


def describe_runs(args, tmp: str) -> list[tuple[str, int, list[str]]]:
    """(name, ranks, program arguments after the script) per selected run."""
    runs = [("main", 4, ["--config", MAIN_PLAN, "--training.steps", str(args.steps),
                         "--logging.metrics_path", os.path.join(tmp, "main_metrics.jsonl")])]
    layouts = parity_layouts()
    if args.runs == "all" or set(args.runs.split(",")) - {"main"}:
        from _train_parity import make_plan, plan_yaml

        from npudist.data import default_corpus_path
        corpus = default_corpus_path()
        for name, (world, kw) in layouts.items():
            path = os.path.join(tmp, f"{name}.yaml")
            with open(path, "w") as f:
                f.write(plan_yaml(make_plan(corpus, "npu", **kw)))
            runs.append((name, world, ["--config", path]))
    if args.runs != "all":
        wanted = args.runs.split(",")
        unknown = set(wanted) - {"main"} - set(layouts)
        if unknown:
            raise SystemExit(f"--runs: unknown {sorted(unknown)}; choose from main, {', '.join(layouts)}")
        runs = [r for r in runs if r[0] in wanted]
    return runs


def launch(name: str, world: int, prog_args: list[str], blocking: bool, tmp: str, timeout: float) -> dict:
    """One npurun job; returns {peak, per_rank, losses, wall_s}."""
    out = os.path.join(tmp, f"{name}.{'blocking' if blocking else 'async'}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("ASCEND_LAUNCH_BLOCKING", None)
    if blocking:
        env["ASCEND_LAUNCH_BLOCKING"] = "1"
    cmd = [sys.executable, "-m", "npudist.launch", "--nproc", str(world), "--master-port", str(free_port()),
           os.path.abspath(__file__), "--rank-worker", out, *prog_args]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{name} ({'blocking' if blocking else 'async'}) exited {res.returncode}:\n"
                           f"{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
    ranks = []
    for r in range(world):
        with open(f"{out}.{r}") as f:
            ranks.append(json.load(f))
    per_rank = [max(d["peaks"]) for d in ranks]
    return {"peak": max(per_rank), "per_rank": per_rank, "losses": ranks[0]["losses"], "wall_s": wall}


def summarize(jobs: list[dict]) -> dict:
    """One mode's jobs: the median over rounds of each job's peak. Why a median: which collective completes
    first moves with the machine's load in both launch modes (collectives run on the group's own threads
    either way), so a single job's peak varies by up to ~25% between identical runs of the same mode."""
    peaks = [j["peak"] for j in jobs]
    return {"peak": statistics.median(peaks), "rounds": peaks, "per_rank": [j["per_rank"] for j in jobs]}


def main(argv=None) -> int:
    args = parse_args(argv)
    mib = 2 ** 20
    print(f"start {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    results, ok = [], True
    with tempfile.TemporaryDirectory(prefix="launch_memory_") as tmp:
        for i, (name, world, prog_args) in enumerate(describe_runs(args, tmp)):
            got = {"async": [], "blocking": []}
            for rnd in range(args.rounds):
                modes = (False, True) if (i + rnd) % 2 == 0 else (True, False)
                for blocking in modes:
                    got["blocking" if blocking else "async"].append(
                        launch(name, world, prog_args, blocking, tmp, args.timeout))
            a, b = (summarize(got[m]) for m in ("async", "blocking"))
            ratio = a["peak"] / b["peak"]
            same_loss = all(r["losses"] == got["async"][0]["losses"] for m in got for r in got[m])
            ok &= ratio <= 1.0 and same_loss
            print(f"{name}: {world} ranks | peak async {a['peak'] / mib:.2f} MiB (rounds "
                  f"{[round(p / mib, 2) for p in a['rounds']]}) | blocking {b['peak'] / mib:.2f} MiB (rounds "
                  f"{[round(p / mib, 2) for p in b['rounds']]}) | async/blocking {ratio:.3f} | "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            print(f"  losses {got['async'][0]['losses']}{'' if same_loss else '  <- DIFFER between runs'}",
                  flush=True)
            results.append({"run": name, "ranks": world, "async": a, "blocking": b, "ratio": ratio,
                            "same_loss": same_loss})
    print(f"end {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average {os.getloadavg()[0]:.1f}")
    print("| run | ranks | peak async (MiB) | peak blocking (MiB) | async / blocking |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['run']} | {r['ranks']} | {r['async']['peak'] / mib:.2f} | {r['blocking']['peak'] / mib:.2f} | "
              f"{r['ratio']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = [r["run"] for r in results if r["ratio"] > 1.0 or not r["same_loss"]]
    print("PASS: every async peak <= blocking peak, losses identical" if ok else
          f"FAIL: {', '.join(bad)} (async peak above blocking or losses differ)")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--rank-worker":
        rank_worker(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(main())
