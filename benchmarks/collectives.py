"""hccl vs gloo collective benchmark (same machine, same run, interleaved rounds, medians).

For each world size the script starts that many worker processes. Each worker initialises gloo as the default
group and an hccl group over the same ranks, then times all_reduce, all_gather_into_tensor,
reduce_scatter_tensor, broadcast and all_to_all_single on float32 tensors from 8 B to 128 MiB. Every size
runs several rounds; each round times hccl and gloo back to back (alternating which goes first), so both
see the same machine load. Reported numbers are medians over rounds of the slowest rank's time per op.

Sizes and bandwidths follow nccl-tests: `size` is the largest buffer of the op (all_gather: the output,
reduce_scatter: the input), algbw = size / time, busbw = algbw * factor with factor 2(n-1)/n for
all_reduce, (n-1)/n for all_gather / reduce_scatter / all_to_all and 1 for broadcast. The physical
reference is the 2-thread memcpy bandwidth (bytes copied per second by two threads together, 64 MiB
each), measured in the same run before and after every world size.

Usage:
    python benchmarks/collectives.py                 # world sizes 2 and 4, 8 B .. 128 MiB
    python benchmarks/collectives.py --quick         # fewer sizes and rounds (about a minute)
    python benchmarks/collectives.py --markdown out.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single"]
FULL_SIZES = [8, 128, 2 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 128 << 20]
QUICK_SIZES = [8, 64 << 10, 1 << 20, 16 << 20]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


# ------------------------------------------------------------------------------------------------
# Physical reference


def memcpy_2thread_gbps(nbytes: int = 64 << 20, reps: int = 5) -> float:
    """Median bandwidth of two threads each copying `nbytes` (numpy releases the GIL while copying)."""
    import numpy as np

    bufs = [(np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)) for _ in range(2)]
    times = []
    for _ in range(reps):
        threads = [threading.Thread(target=np.copyto, args=(dst, src)) for src, dst in bufs]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(times) / 1e9


# ------------------------------------------------------------------------------------------------
# Worker side


def _make_call(op, group, n, rank, count, device):
    import torch
    import torch.distributed as dist

    if op == "all_reduce":
        x = torch.ones(count, device=device)
        return lambda: dist.all_reduce(x, group=group)
    if op == "broadcast":
        x = torch.ones(count, device=device)
        return lambda: dist.broadcast(x, src=0, group=group)
    if op == "all_gather_into_tensor":
        inp = torch.ones(count // n, device=device)
        out = torch.empty(count, device=device)
        return lambda: dist.all_gather_single(out, inp, group=group)  # = all_gather_into_tensor
    if op == "reduce_scatter_tensor":
        inp = torch.ones(count, device=device)
        out = torch.empty(count // n, device=device)
        return lambda: dist.reduce_scatter_single(out, inp, group=group)  # = reduce_scatter_tensor
    if op == "all_to_all_single":
        inp = torch.ones(count, device=device)
        out = torch.empty(count, device=device)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    raise ValueError(f"unknown op {op!r}; choose from {OPS}")


def _timed(call, iters, barrier):
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import npudist  # noqa: F401  (registers the npu device and the hccl backend)

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="file://" + args.store, rank=rank, world_size=n)
    hccl = dist.new_group(backend="hccl")
    gloo = dist.group.WORLD
    hccl_device = "npu" if args.device == "npu" else "cpu"
    if args.device == "npu":
        torch.npu.set_device(rank % torch.npu.device_count())
    backends = {"hccl": (hccl, hccl_device), "gloo": (gloo, "cpu")}
    slowest = torch.zeros(1)
    results = []

    def agree_max(value: float) -> float:
        """Slowest rank's value (all ranks get it; uses gloo, outside any timed window)."""
        slowest[0] = value
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=gloo)
        return float(slowest[0])

    for op in args.ops:
        for size in args.sizes:
            count = max(size // 4, n)
            count -= count % n
            calls, iters, samples = {}, {}, {"hccl": [], "gloo": []}
            for name, (group, device) in backends.items():
                calls[name] = _make_call(op, group, n, rank, count, device)
                barrier = (lambda g=group: dist.barrier(group=g))
                calls[name]()  # warm up (connects, allocates, faults in pages)
                t = agree_max(_timed(calls[name], 1, barrier))
                iters[name] = max(1, min(args.max_iters, int(args.round_seconds / max(t, 1e-7))))
            for rnd in range(args.rounds):
                order = ["hccl", "gloo"] if rnd % 2 == 0 else ["gloo", "hccl"]
                for name in order:
                    group = backends[name][0]
                    t = _timed(calls[name], iters[name], lambda g=group: dist.barrier(group=g))
                    samples[name].append(agree_max(t))
            if rank == 0:
                row = {"op": op, "n": n, "bytes": count * 4,
                       "hccl_s": statistics.median(samples["hccl"]), "gloo_s": statistics.median(samples["gloo"]),
                       "iters": iters}
                results.append(row)
                print(json.dumps(row), flush=True)
            del calls
    dist.barrier(group=gloo)
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------
# Launcher side


def run_world(n: int, args) -> list[dict]:
    fd, store = tempfile.mkstemp(prefix="npudist_bench_store_")
    os.close(fd)
    os.unlink(store)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--store", store,
           "--ops", ",".join(args.ops), "--sizes", ",".join(map(str, args.sizes)),
           "--rounds", str(args.rounds), "--round-seconds", str(args.round_seconds),
           "--max-iters", str(args.max_iters), "--device", args.device]
    env = dict(os.environ, WORLD_SIZE=str(n), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE if r == 0 else None,
                              text=True) for r in range(n)]
    rows = []
    try:
        for line in procs[0].stdout:
            line = line.strip()
            if line.startswith("{"):
                row = json.loads(line)
                rows.append(row)
                print_row(row, args.memcpy_ref)
            elif line:
                print(line)
        for p in procs:
            p.wait(timeout=args.timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if os.path.exists(store):
            os.unlink(store)
    bad = [p.returncode for p in procs if p.returncode != 0]
    if bad:
        raise SystemExit(f"benchmark workers failed with exit codes {bad}")
    return rows


def fmt_bytes(b: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b} B"


def derived(row: dict) -> dict:
    n, size = row["n"], row["bytes"]
    f = bus_factor(row["op"], n)
    h_alg, g_alg = size / row["hccl_s"] / 1e9, size / row["gloo_s"] / 1e9
    return {"hccl_algbw": h_alg, "hccl_busbw": h_alg * f, "gloo_algbw": g_alg, "gloo_busbw": g_alg * f,
            "ratio": row["gloo_s"] / row["hccl_s"]}


HEADER = (f"{'op':<23} {'size':>9} {'hccl us':>10} {'gloo us':>11} {'hccl algbw':>10} {'hccl busbw':>10} "
          f"{'gloo busbw':>10} {'hccl/gloo':>9} {'busbw/memcpy':>12}")


def print_row(row: dict, memcpy: float) -> None:
    d = derived(row)
    print(f"{row['op']:<23} {fmt_bytes(row['bytes']):>9} {row['hccl_s'] * 1e6:10.1f} {row['gloo_s'] * 1e6:11.1f} "
          f"{d['hccl_algbw']:10.3f} {d['hccl_busbw']:10.3f} {d['gloo_busbw']:10.3f} {d['ratio']:8.1f}x "
          f"{100 * d['hccl_busbw'] / memcpy:11.0f}%", flush=True)


def check_targets(rows: list[dict], memcpy: float) -> list[str]:
    """The benchmark's targets, evaluated on this run (informational: printed, not asserted)."""
    out = []

    def find(op, n, size):
        return next((r for r in rows if r["op"] == op and r["n"] == n and r["bytes"] == size), None)

    def check(label, ok):
        out.append(f"[{'met' if ok else 'MISSED'}] {label}")

    for size in (16 << 20, 128 << 20):
        r = find("all_reduce", 2, size)
        if r:
            d = derived(r)
            check(f"all_reduce 2 ranks {fmt_bytes(size)}: {d['ratio']:.1f}x gloo (>= 3x)", d["ratio"] >= 3)
            check(f"all_reduce 2 ranks {fmt_bytes(size)}: busbw {d['hccl_busbw']:.2f} GB/s = "
                  f"{100 * d['hccl_busbw'] / memcpy:.0f}% of 2-thread memcpy {memcpy:.2f} GB/s (>= 40%)",
                  d["hccl_busbw"] >= 0.4 * memcpy)
    r = find("all_reduce", 2, 1 << 20)
    if r:
        d = derived(r)
        check(f"all_reduce 2 ranks 1 MiB: {d['ratio']:.1f}x gloo (>= 5x)", d["ratio"] >= 5)
    r = find("all_reduce", 2, 8)
    if r:
        d = derived(r)
        check(f"all_reduce 2 ranks 8 B: latency {r['hccl_s'] * 1e6:.1f} us vs gloo {r['gloo_s'] * 1e6:.1f} us "
              f"(<= 1/10)", d["ratio"] >= 10)
    for op in OPS[1:]:
        big = [r for r in rows if r["op"] == op and r["n"] == 2 and r["bytes"] >= 1 << 20]
        if big:
            worst = min(big, key=lambda r: derived(r)["ratio"])
            check(f"{op} 2 ranks >= 1 MiB: worst {derived(worst)['ratio']:.1f}x gloo at "
                  f"{fmt_bytes(worst['bytes'])} (>= 3x)", derived(worst)["ratio"] >= 3)
    four = [r for r in rows if r["n"] == 4]
    if four:
        worst = min(four, key=lambda r: derived(r)["ratio"])
        check(f"4 ranks on {os.cpu_count()} cores: worst {derived(worst)['ratio']:.1f}x gloo "
              f"({worst['op']} {fmt_bytes(worst['bytes'])}) (no size slower than gloo)", derived(worst)["ratio"] >= 1)
    return out


def write_markdown(path: str, rows: list[dict], memcpy_runs: list[float], targets: list[str], args) -> None:
    memcpy = statistics.median(memcpy_runs)
    lines = [f"2-thread memcpy bandwidth (same run): median {memcpy:.2f} GB/s "
             f"(samples: {', '.join(f'{m:.2f}' for m in memcpy_runs)}). "
             f"{args.rounds} interleaved rounds per point, medians; float32; hccl on {args.device} tensors, "
             f"gloo on cpu tensors.", ""]
    for n in sorted({r["n"] for r in rows}):
        lines += [f"**{n} ranks**", "",
                  "| op | size | hccl time (us) | gloo time (us) | hccl algbw (GB/s) | hccl busbw (GB/s) | "
                  "gloo busbw (GB/s) | hccl/gloo | hccl busbw / memcpy |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in rows if r["n"] == n):
            d = derived(r)
            lines.append(f"| {r['op']} | {fmt_bytes(r['bytes'])} | {r['hccl_s'] * 1e6:.1f} | {r['gloo_s'] * 1e6:.1f} | "
                         f"{d['hccl_algbw']:.3f} | {d['hccl_busbw']:.3f} | {d['gloo_busbw']:.3f} | "
                         f"{d['ratio']:.1f}x | {100 * d['hccl_busbw'] / memcpy:.0f}% |")
        lines.append("")
    lines += ["Targets, evaluated on this run:", ""] + [f"- {t}" for t in targets]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", default=None, help="comma-separated byte sizes (default: 8 B .. 128 MiB)")
    p.add_argument("--quick", action="store_true", help="sizes 8 B, 64 KiB, 1 MiB, 16 MiB; 3 rounds")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--round-seconds", type=float, default=None, help="target duration of one timed round")
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--device", choices=["cpu", "npu"], default="cpu", help="tensor device for hccl")
    p.add_argument("--markdown", default=None, help="also write the tables as markdown to this file")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ops = args.ops.split(",")
    for op in args.ops:
        if op not in OPS:
            p.error(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    args.sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (QUICK_SIZES if args.quick else FULL_SIZES)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.round_seconds = args.round_seconds or (0.03 if args.quick else 0.08)
    if args.worker:
        worker(args)
        return
    memcpy_runs = [memcpy_2thread_gbps()]
    rows = []
    for n in [int(x) for x in args.world_sizes.split(",")]:
        args.memcpy_ref = statistics.median(memcpy_runs)
        print(f"\n== {n} ranks (2-thread memcpy so far: {args.memcpy_ref:.2f} GB/s) ==\n{HEADER}", flush=True)
        rows += run_world(n, args)
        memcpy_runs.append(memcpy_2thread_gbps())
    memcpy = statistics.median(memcpy_runs)
    print(f"\n2-thread memcpy bandwidth: median {memcpy:.2f} GB/s over {len(memcpy_runs)} measurements "
          f"({', '.join(f'{m:.2f}' for m in memcpy_runs)})")
    targets = check_targets(rows, memcpy)
    print("\n".join(targets))
    if args.markdown:
        write_markdown(args.markdown, rows, memcpy_runs, targets, args)
        print(f"markdown written to {args.markdown}")


if __name__ == "__main__":
    main()
