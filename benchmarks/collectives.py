"""hccl vs Gloo collective benchmark: same ranks, same run, interleaved rounds, medians, against each op's
copy-bound ceiling.

For each world size the script starts that many worker processes. Each worker initialises Gloo as the
default group and an hccl group over the same ranks, then times broadcast, all_gather_into_tensor,
reduce_scatter_tensor, all_reduce and all_to_all_single (even splits, and uneven splits where every rank
sends a different amount to every peer) on float32 tensors. hccl runs on cpu tensors (private memory:
staged through shared memory, or copied once with cross-memory attach) and on npu tensors (zero-copy: ranks
map each other's device memory); Gloo runs on cpu tensors. Every point runs several rounds; each round
times every variant back to back, rotating which goes first, so all see the same machine load. Reported
numbers are medians over rounds of the slowest rank's time per op.

Sizes and bus bandwidth follow nccl-tests: `size` is the largest buffer of the op (all_gather: the output,
reduce_scatter: the input), algbw = size / time, busbw = algbw * factor with factor 2(n-1)/n for
all_reduce, (n-1)/n for all_gather / reduce_scatter / all_to_all and 1 for broadcast.

The ceiling of an op (docs/hccl_engine.md, "Copy-bound ceilings") is the time the machine needs to move the
bytes the op must move at least, at the memcpy roofline R: bytes copied per second by all cores together.
R is measured in the same interleaved rounds as the ops (every rank copies 64 MiB between two private
buffers at once; R = ranks x 64 MiB / slowest rank's time), so a busy machine lowers the ceiling and the
op's time alike; the 2-thread memcpy bandwidth around every world size is printed for reference.
In memcpy-equivalents (one byte read plus one written), with S = size and n ranks:
broadcast (n-1)S, all_gather n*S (out of place), all_to_all n*S, all_reduce n*S (read n*S, write n*S),
reduce_scatter (n+1)S/2 (read n*S, write S). "% of ceiling" = (bytes / R) / measured time; above 100% means
the data stayed in the caches, which the 64 MiB memcpy reference does not.

That ceiling assumes every byte crosses between processes at memcpy speed, which private memory does not
allow. cpu-tensor rows therefore also report "% of platform ceiling" (docs/hccl_engine.md, "Copy-bound
ceilings", "cpu tensors"): the cheaper of the two routes the platform has, each counted in
memcpy-equivalents: staged through shared memory (the owner copies a byte in, every reader copies it out)
or single-copy cross-memory attach, where a byte moved with process_vm_readv costs 1/rho, rho = CMA rate /
memcpy rate. The CMA rate is measured in the same interleaved rounds as R (every rank reads 64 MiB of a
peer's private buffer with process_vm_readv at once). The target for cpu tensors (>= 1 MiB) is >= 80% of
that platform ceiling; "% of ceiling" stays as the one-copy-at-memcpy reference.

Usage:
    python benchmarks/collectives.py                       # 2 and 4 ranks, cpu and npu, 1 MiB .. 64 MiB
    python benchmarks/collectives.py --quick               # 1 MiB and 16 MiB, 3 rounds
    python benchmarks/collectives.py --devices npu --world-sizes 2 --sizes 16777216
    python benchmarks/collectives.py --markdown out.md     # also write the tables as markdown
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

from _roofline_probes import PROBE_BYTES, make_cma_reader, make_memcpy, memcpy_2thread_gbps

OPS = ["broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "all_to_all_single",
       "all_to_all_single_uneven"]
DEVICES = ["cpu", "npu"]
FULL_SIZES = [8, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [1 << 20, 16 << 20]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


def ceiling_copy_bytes(op: str, n: int, size: int) -> float:
    """Bytes the machine must copy at least for one op (memcpy-equivalents: one read plus one write)."""
    if op == "broadcast":
        return (n - 1) * size          # every receiver's buffer written once from the root's
    if op == "reduce_scatter_tensor":
        return (n + 1) * size / 2      # every input read once (n*S), every output written once (S)
    return n * size                    # all_gather / all_to_all: every output byte written once from its
    # source; all_reduce: every input read once and every output written once (n*S each)


def kept_bytes(op: str, n: int, size: int) -> float:
    """Bytes of an all_to_all that stay on their rank (summed over ranks): never cross a process."""
    if op == "all_to_all_single_uneven":
        weights = [uneven_splits(n, i)[0][i] for i in range(n)]
        return size * sum(weights) / sum(uneven_splits(n, 0)[0])
    return size  # even splits: every rank keeps S/n


def cpu_route_copy_bytes(op: str, n: int, size: int, rho: float | None) -> dict:
    """Memcpy-equivalents each route needs for one op on cpu tensors (private memory):
    "staged" through the shared-memory slots (the owner copies a byte in, each reader copies it out), and
    "cma", single-copy cross-memory attach, where a byte moved between processes costs 1 / rho (rho = CMA
    rate / memcpy rate; None or 0 when CMA is refused: that route is unavailable). A reduction reads its
    peers' data in its own address space, so its CMA route copies peers' bytes into a private buffer
    first. Derivation: docs/hccl_engine.md, "Copy-bound ceilings", "cpu tensors"."""
    def cma(crossing: float, local: float) -> float:
        return local + (crossing / rho if rho else float("inf"))

    if op == "broadcast":  # root copies S in, n-1 receivers copy S out / each receiver's S crosses once
        return {"staged": n * size, "cma": cma((n - 1) * size, 0)}
    if op == "all_gather_into_tensor":  # n inputs of S/n in, (n-1)S out, own blocks S / (n-1)S cross, own S
        return {"staged": (n + 1) * size, "cma": cma((n - 1) * size, size)}
    if op.startswith("all_to_all"):  # the n*S - K bytes that change rank go in and out; the K kept move once
        k = kept_bytes(op, n, size)
        return {"staged": 2 * (n * size - k) + k, "cma": cma(n * size - k, k)}
    if op == "reduce_scatter_tensor":  # (n-1)S of peers' blocks reach their reducer, then the reduction
        reduction = (n + 1) * size / 2
        return {"staged": (n - 1) * size + reduction, "cma": cma((n - 1) * size, reduction)}
    if op == "all_reduce":  # peers' segments to the reducer, reduction, reduced segments back to the others;
        # staged the reduction also writes its segment into the slot (n reads + 2 writes of S/n per rank)
        return {"staged": 2 * (n - 1) * size + (n + 2) * size / 2,
                "cma": cma(2 * (n - 1) * size, (n + 1) * size / 2)}
    raise ValueError(f"unknown op {op!r}")


def platform_ceiling(op: str, n: int, size: int, rho: float | None) -> tuple[str, float]:
    """The cheaper route for cpu tensors and its memcpy-equivalents."""
    routes = cpu_route_copy_bytes(op, n, size, rho)
    best = min(routes, key=routes.get)
    return best, routes[best]


def uneven_splits(n: int, rank: int) -> tuple[list[int], list[int], int]:
    """Uneven all_to_all weights: rank i sends w(i, j) = 1 + (i + j) % n units to rank j. Every rank sends
    and receives the same total (the weights of a row and of a column are a permutation of 1..n), so the
    op's size is comparable with the even one while every pair's split differs."""
    send = [1 + (rank + j) % n for j in range(n)]
    recv = [1 + (j + rank) % n for j in range(n)]
    return send, recv, sum(send)


# ------------------------------------------------------------------------------------------------
# Physical reference (the probes timed in the rounds: benchmarks/_roofline_probes.py)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


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
    if op == "all_to_all_single_uneven":
        send, recv, total = uneven_splits(n, rank)
        unit = count // total
        inp = torch.ones(unit * total, device=device)
        out = torch.empty(unit * total, device=device)
        ins, outs = [unit * w for w in send], [unit * w for w in recv]
        return lambda: dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins, group=group)
    raise ValueError(f"unknown op {op!r}; choose from {OPS}")


def _element_count(op: str, n: int, size: int) -> int:
    count = max(size // 4, n)
    if op == "all_to_all_single_uneven":
        total = sum(uneven_splits(n, 0)[0])
        return max(count - count % total, total)
    return count - count % n


def _timed(call, iters, sync, barrier):
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    sync()
    return (time.perf_counter() - t0) / iters


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import npudist  # noqa: F401  (registers the npu device and the hccl backend)

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="file://" + args.store, rank=rank, world_size=n)
    hccl = dist.new_group(backend="hccl")
    gloo = dist.group.WORLD
    if "npu" in args.devices:
        torch.npu.set_device(rank % torch.npu.device_count())
    variants = {"gloo": (gloo, "cpu")}
    for dev in args.devices:
        variants[f"hccl_{dev}"] = (hccl, dev)
    syncs = {name: (torch.npu.synchronize if dev == "npu" else (lambda: None)) for name, (_, dev) in variants.items()}
    slowest = torch.zeros(1)

    def agree_max(value: float) -> float:
        """Slowest rank's value (all ranks get it; uses gloo, outside any timed window)."""
        slowest[0] = value
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=gloo)
        return float(slowest[0])

    cma = make_cma_reader(rank, n, gloo)
    probes = ["memcpy"] + (["cma"] if cma else [])
    names = list(variants) + probes
    syncs["memcpy"] = syncs["cma"] = lambda: None
    for op in args.ops:
        for size in args.sizes:
            count = _element_count(op, n, size)
            calls, iters, samples = {}, {}, {name: [] for name in names}
            calls["memcpy"], iters["memcpy"] = make_memcpy(), 1
            calls["memcpy"]()  # faults in the pages
            if cma:
                calls["cma"], iters["cma"] = cma, 1
            for name, (group, device) in variants.items():
                calls[name] = _make_call(op, group, n, rank, count, device)
                barrier = (lambda g=group: dist.barrier(group=g))
                calls[name]()  # warm up (connects, allocates, faults in pages)
                syncs[name]()
                t = agree_max(_timed(calls[name], 1, syncs[name], barrier))
                iters[name] = max(1, min(args.max_iters, int(args.round_seconds / max(t, 1e-7))))
            for rnd in range(args.rounds):
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                if rnd % 2:
                    order.reverse()
                for name in order:
                    group = variants[name][0] if name in variants else gloo
                    t = _timed(calls[name], iters[name], syncs[name], lambda g=group: dist.barrier(group=g))
                    samples[name].append(agree_max(t))
            if rank == 0:
                rate = {p: statistics.median(n * PROBE_BYTES / t / 1e9 for t in samples[p]) for p in probes}
                row = {"op": op, "n": n, "bytes": count * 4, "load": load_average(), "roofline_gbps": rate["memcpy"],
                       "cma_gbps": rate.get("cma"),
                       **{f"{name}_s": statistics.median(samples[name]) for name in names if name not in probes}}
                print(json.dumps(row), flush=True)
            del calls
    dist.barrier(group=gloo)
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------
# Launcher side


def run_world(n: int, args, tree: str = ROOT) -> list[dict]:
    """Times every point on n ranks; the workers import npudist from `tree` (compare_collectives.py passes
    another source tree)."""
    fd, store = tempfile.mkstemp(prefix="npudist_bench_store_")
    os.close(fd)
    os.unlink(store)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--store", store,
           "--ops", ",".join(args.ops), "--sizes", ",".join(map(str, args.sizes)),
           "--rounds", str(args.rounds), "--round-seconds", str(args.round_seconds),
           "--max-iters", str(args.max_iters), "--devices", ",".join(args.devices)]
    env = dict(os.environ, WORLD_SIZE=str(n), PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""),
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
                for dev in args.devices:
                    print_row(row, dev)
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
            return f"{b / scale:.4g} {unit}"
    return f"{b} B"


def derived(row: dict, dev: str) -> dict:
    n, size, op, memcpy = row["n"], row["bytes"], row["op"], row["roofline_gbps"]
    t, g = row[f"hccl_{dev}_s"], row["gloo_s"]
    alg = size / t / 1e9
    ceiling_s = ceiling_copy_bytes(op, n, size) / (memcpy * 1e9)
    out = {"algbw": alg, "busbw": alg * bus_factor(op, n), "gloo_busbw": size / g / 1e9 * bus_factor(op, n),
           "ratio": g / t, "ceiling_pct": 100 * ceiling_s / t,
           "ceiling_busbw": size / ceiling_s / 1e9 * bus_factor(op, n),
           "rho": None, "platform_route": None, "platform_pct": None, "platform_busbw": None}
    if dev == "cpu":  # private memory: the platform's cheaper route, not one copy at memcpy speed
        rho = row["cma_gbps"] / memcpy if row.get("cma_gbps") else None
        route, copy_bytes = platform_ceiling(op, n, size, rho)
        platform_s = copy_bytes / (memcpy * 1e9)
        out.update(rho=rho, platform_route=route, platform_pct=100 * platform_s / t,
                   platform_busbw=size / platform_s / 1e9 * bus_factor(op, n))
    return out


def _platform_cells(d: dict) -> tuple[str, str, str]:
    """(platform ceiling busbw, % of it with the route, rho) as text; blank for npu rows."""
    if d["platform_pct"] is None:
        return "-", "-", "-"
    rho = f"{d['rho']:.2f}" if d["rho"] else "refused"
    return f"{d['platform_busbw']:.2f}", f"{d['platform_pct']:.0f}% {d['platform_route']}", rho


HEADER = (f"{'op':<25} {'dev':>3} {'size':>8} {'hccl us':>10} {'gloo us':>10} {'hccl/gloo':>9} "
          f"{'busbw GB/s':>10} {'ceiling':>8} {'% ceiling':>9} {'platform':>8} {'% platform':>13} {'rho':>7} "
          f"{'R GB/s':>7}")


def print_row(row: dict, dev: str) -> None:
    d = derived(row, dev)
    plat_busbw, plat_pct, rho = _platform_cells(d)
    print(f"{row['op']:<25} {dev:>3} {fmt_bytes(row['bytes']):>8} {row[f'hccl_{dev}_s'] * 1e6:10.1f} "
          f"{row['gloo_s'] * 1e6:10.1f} {d['ratio']:8.1f}x {d['busbw']:10.2f} {d['ceiling_busbw']:8.2f} "
          f"{d['ceiling_pct']:8.0f}% {plat_busbw:>8} {plat_pct:>13} {rho:>7} {row['roofline_gbps']:7.2f}", flush=True)


def check_targets(rows: list[dict], devices: list[str]) -> list[str]:
    """The targets, evaluated on this run (printed, not asserted):
    cpu tensors, >= 1 MiB: every op >= 80% of its platform ceiling (the cheaper of the staged and the
    cross-memory-attach route at the measured rho, cpu_route_copy_bytes);
    npu tensors, 16 MiB: every op >= 5x Gloo at 2 ranks and >= 4x at 4 ranks; >= 16 MiB: busbw >= 80% of
    the op's ceiling."""
    out = []

    def check(label, ok):
        out.append(f"[{'met' if ok else 'MISSED'}] {label}")

    if "cpu" in devices:
        for r in rows:
            if r["bytes"] >= (1 << 20) - 64:  # uneven splits round the size down by a few elements
                d = derived(r, "cpu")
                rho = f"rho {d['rho']:.2f}" if d["rho"] else "cross-memory attach refused"
                check(f"cpu {r['op']} {r['n']} ranks {fmt_bytes(r['bytes'])}: {d['platform_pct']:.0f}% of the "
                      f"platform ceiling ({d['platform_route']} route, {rho}; >= 80%)", d["platform_pct"] >= 80)
    if "npu" in devices:
        for r in rows:
            d = derived(r, "npu")
            if abs(r["bytes"] - (16 << 20)) <= 64:  # uneven splits round the size down by a few elements
                want = 5.0 if r["n"] == 2 else 4.0
                check(f"npu {r['op']} {r['n']} ranks {fmt_bytes(r['bytes'])}: {d['ratio']:.1f}x gloo (>= {want:g}x)",
                      d["ratio"] >= want)
            if r["bytes"] >= (16 << 20) - 64:
                check(f"npu {r['op']} {r['n']} ranks {fmt_bytes(r['bytes'])}: busbw {d['busbw']:.2f} GB/s = "
                      f"{d['ceiling_pct']:.0f}% of ceiling (>= 80%)", d["ceiling_pct"] >= 80)
    return out


def write_markdown(path: str, rows: list[dict], memcpy_runs: list[float], targets: list[str], args) -> None:
    memcpy = statistics.median(memcpy_runs)
    lines = [f"{args.rounds} interleaved rounds per point, medians; float32; Gloo on cpu tensors. R: the memcpy "
             f"roofline measured in the same rounds; 2-thread memcpy around the world sizes: median {memcpy:.2f} "
             f"GB/s (samples: {', '.join(f'{m:.2f}' for m in memcpy_runs)}). rho: process_vm_readv rate over R, "
             f"measured in the same rounds; platform ceiling (cpu tensors): the cheaper of the staged and the "
             f"cross-memory-attach route at that rho, named after the percentage.", ""]
    for n in sorted({r["n"] for r in rows}):
        lines += [f"**{n} ranks**", "",
                  "| op | tensors | size | hccl (us) | Gloo (us) | hccl/Gloo | hccl busbw (GB/s) | ceiling busbw (GB/s) "
                  "| % of ceiling | platform ceiling busbw (GB/s) | % of platform ceiling | rho | R (GB/s) | load |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in (r for r in rows if r["n"] == n):
            for dev in args.devices:
                d = derived(r, dev)
                plat_busbw, plat_pct, rho = _platform_cells(d)
                lines.append(f"| {r['op']} | {dev} | {fmt_bytes(r['bytes'])} | {r[f'hccl_{dev}_s'] * 1e6:.0f} | "
                             f"{r['gloo_s'] * 1e6:.0f} | {d['ratio']:.1f}x | {d['busbw']:.2f} | {d['ceiling_busbw']:.2f} | "
                             f"{d['ceiling_pct']:.0f}% | {plat_busbw} | {plat_pct} | {rho} | {r['roofline_gbps']:.2f} | "
                             f"{r['load'].split()[0]} |")
        lines.append("")
    lines += ["Targets, evaluated on this run:", ""] + [f"- {t}" for t in targets]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--devices", default="cpu,npu", help="tensor devices for hccl (comma-separated: cpu, npu)")
    p.add_argument("--sizes", default=None, help="comma-separated byte sizes (default: 8 B .. 64 MiB)")
    p.add_argument("--quick", action="store_true", help="sizes 1 MiB and 16 MiB; 3 rounds")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--round-seconds", type=float, default=None, help="target duration of one timed round")
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--markdown", default=None, help="also write the tables as markdown to this file")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ops = args.ops.split(",")
    for op in args.ops:
        if op not in OPS:
            p.error(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    args.devices = args.devices.split(",")
    for dev in args.devices:
        if dev not in DEVICES:
            p.error(f"unknown device {dev!r}; choose from {', '.join(DEVICES)}")
    args.sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (QUICK_SIZES if args.quick else FULL_SIZES)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.round_seconds = args.round_seconds or (0.03 if args.quick else 0.08)
    if args.worker:
        worker(args)
        return
    memcpy_runs = [memcpy_2thread_gbps()]
    rows = []
    print(f"load average at start: {load_average()}")
    for n in [int(x) for x in args.world_sizes.split(",")]:
        print(f"\n== {n} ranks (2-thread memcpy so far: {statistics.median(memcpy_runs):.2f} GB/s) ==\n{HEADER}",
              flush=True)
        rows += run_world(n, args)
        memcpy_runs.append(memcpy_2thread_gbps())
    memcpy = statistics.median(memcpy_runs)
    print(f"\n2-thread memcpy: median {memcpy:.2f} GB/s over {len(memcpy_runs)} measurements "
          f"({', '.join(f'{m:.2f}' for m in memcpy_runs)}); load average at end: {load_average()}")
    targets = check_targets(rows, args.devices)
    print("\n".join(targets))
    if args.markdown:
        write_markdown(args.markdown, rows, memcpy_runs, targets, args)
        print(f"markdown written to {args.markdown}")


if __name__ == "__main__":
    main()
