"""Small-message all_reduce latency: hccl beside PyTorch's own call path (the c10d floor).

The floor is `dist.all_reduce` on torch's fake backend (torch.testing._internal.distributed.fake_pg), which
does no communication: what c10d itself costs per call. hccl runs on cpu and npu tensors in the same worker
processes. Each round times every variant back to back (rotating the first), so all see the same machine
load; the reported number is the median over rounds of the slowest rank's mean time per call.

With --ab VAR=VALUE a second hccl group is connected with that environment variable set (the engine reads its
tunables at connect, docs/hccl_engine.md) and timed in the same rounds: an engine setting's before/after in
one run, e.g. --ab NPUDIST_ENGINE_TINY=0.

Usage:
    python benchmarks/small_latency.py                      # 2 ranks, 8 B and 64 KiB
    python benchmarks/small_latency.py --ranks 2 --rounds 15 --iters 2000
    python benchmarks/small_latency.py --sizes 8 --ab NPUDIST_ENGINE_TINY=0
"""
import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _time_calls(fn, iters, sync):
    for _ in range(max(10, iters // 20)):
        fn()
    sync()  # warm-up calls on npu tensors may still be queued on the stream
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def _connect_with(var, value):
    """An hccl group whose engine connected with `var`=`value` (a collective connects it)."""
    before = os.environ.get(var)
    os.environ[var] = value
    try:
        group = dist.new_group(backend="hccl")
        dist.barrier(group=group)
    finally:
        if before is None:
            del os.environ[var]
        else:
            os.environ[var] = before
    return group


def _worker(rank, n, store_path, sizes, rounds, iters, ab, queue):
    import npudist  # noqa: F401  (registers the npu device and the hccl backend)
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=n)
    hccl = dist.new_group(backend="hccl")
    dist.barrier(group=hccl)
    other = _connect_with(*ab.split("=", 1)) if ab else None
    fake = dist.new_group(backend="fake")
    results = {}
    for size in sizes:
        count = max(1, size // 4)
        tensors = {"cpu": torch.ones(count), "npu": torch.ones(count, device="npu")}
        variants = {
            "c10d floor (fake)": lambda t=tensors["cpu"]: dist.all_reduce(t, group=fake),
            "hccl cpu": lambda t=tensors["cpu"]: dist.all_reduce(t, group=hccl),
            "hccl npu": lambda t=tensors["npu"]: dist.all_reduce(t, group=hccl),
        }
        if other is not None:
            variants[f"hccl cpu [{ab}]"] = lambda t=tensors["cpu"]: dist.all_reduce(t, group=other)
            variants[f"hccl npu [{ab}]"] = lambda t=tensors["npu"]: dist.all_reduce(t, group=other)
        names = list(variants)
        per = {k: [] for k in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                dist.barrier(group=hccl)
                sync = torch.npu.synchronize if "npu" in name else (lambda: None)
                per[name].append(_time_calls(variants[name], iters, sync))
        results[size] = per
    queue.put((rank, results))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 65536])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--ab", default="", metavar="VAR=VALUE",
                   help="also time a second hccl group connected with this engine setting")
    a = p.parse_args()
    if a.ab and "=" not in a.ab:
        p.error(f"--ab takes VAR=VALUE, got {a.ab!r}")
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_worker, args=(r, a.ranks, os.path.join(d, "store"), a.sizes, a.rounds,
                                                   a.iters, a.ab, q)) for r in range(a.ranks)]
        for pr in procs:
            pr.start()
        got = [q.get() for _ in procs]
        for pr in procs:
            pr.join(60)
    per_rank = [res for _, res in sorted(got)]
    print(f"{a.ranks} ranks, fp32, {a.rounds} rounds x {a.iters} calls; median over rounds of slowest rank, µs")
    for size in a.sizes:
        names = list(per_rank[0][size])
        slowest = {k: [max(pr[size][k][i] for pr in per_rank) for i in range(a.rounds)] for k in names}
        med = {k: statistics.median(v) * 1e6 for k, v in slowest.items()}
        print(f"  {size} B: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))


if __name__ == "__main__":
    main()
