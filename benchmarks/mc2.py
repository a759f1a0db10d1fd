"""MC2 operators against their unfused form: the same collective + matmul, one after the other.

Two ranks (hccl, npu) time, per operator, the fused call (npu_all_gather_base_mm, npu_mm_reduce_scatter_base,
npu_mm_all_reduce_base; with --max-chunks > 1 chunked, each chunk's matmul overlapping the next chunk's
collective) and the unfused
reference (all_gather_single then one matmul; one matmul then reduce_scatter_single; one matmul then
all_reduce). Rounds alternate which form goes first; each timing runs between barriers and ends with
torch.npu.synchronize(); a round's time is the slowest rank's. Prints the median per form and
unfused / fused (above 1: the fused operator is faster).

Usage:
    python benchmarks/mc2.py                    # m=k=n=1024 per rank, float32, 15 rounds
    python benchmarks/mc2.py --m 2048 --k 1024 --n 2048 --rounds 21 --dtype bfloat16
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _forms(rank, world, hcom, a, w, group):
    ops = torch.ops.npu
    rows = a.shape[0]

    def ag_unfused():
        g = a.new_empty((world * rows, a.shape[1]))
        dist.all_gather_single(g, a, group=group)
        return g @ w

    def rs_unfused():
        out = a.new_empty((rows // world, w.shape[1]))
        dist.reduce_scatter_single(out, a @ w, group=group)
        return out

    def ar_unfused():
        out = a @ w
        dist.all_reduce(out, group=group)
        return out

    return {
        "all_gather+matmul": (lambda: ops.npu_all_gather_base_mm(a, w, hcom, world), ag_unfused),
        "matmul+reduce_scatter": (lambda: ops.npu_mm_reduce_scatter_base(a, w, hcom, world), rs_unfused),
        "matmul+all_reduce": (lambda: ops.npu_mm_all_reduce_base(a, w, hcom), ar_unfused),
    }


def _time(fn, group):
    dist.barrier(group=group)
    torch.npu.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.npu.synchronize()
    t = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)   # over gloo: the timing itself is not on hccl
    return t.item()


def _worker(rank, world, port, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch_npu  # noqa: F401  (get_hccl_comm_name, the operators)
    from npudist.ops import mc2
    if args.max_chunks is not None:
        mc2._MAX_CHUNKS = args.max_chunks   # a measurement knob: how much the chunked pipeline buys
    torch.npu.set_device(rank)
    dist.init_process_group("cpu:gloo,npu:hccl", rank=rank, world_size=world)
    dtype = getattr(torch, args.dtype)
    dev = torch.device("npu", rank)
    gen = torch.Generator().manual_seed(rank)
    a = torch.randn(args.m, args.k, generator=gen).to(dtype).to(dev)
    w = torch.randn(args.k, args.n, generator=gen).to(dtype).to(dev)
    hcom = dist.group.WORLD._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
    forms = _forms(rank, world, hcom, a, w, dist.group.WORLD)
    for fused, unfused in forms.values():   # warm-up: allocator, communicator buffers
        fused(), unfused()
    times = {name: {"fused": [], "unfused": []} for name in forms}
    for r in range(args.rounds):
        for name, (fused, unfused) in forms.items():
            order = (("fused", fused), ("unfused", unfused))
            for form, fn in (order if r % 2 == 0 else order[::-1]):
                times[name][form].append(_time(fn, dist.group.WORLD))
    if rank == 0:
        queue.put(times)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=1024, help="rows of each rank's input")
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--max-chunks", type=int, default=None,
                        help="pipeline depth of the fused operators (default: npudist's; 1 = no overlap)")
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    times = queue.get(timeout=1800)
    for p in procs:
        p.join(120)
    depth = args.max_chunks if args.max_chunks is not None else "default"
    print(f"2 ranks, m={args.m} (per rank) k={args.k} n={args.n} {args.dtype}, max chunks {depth}, {args.rounds} "
          f"alternating rounds, median of the slowest rank's time")
    print(f"{'operator':<24}{'fused ms':>10}{'unfused ms':>12}{'unfused/fused':>15}")
    for name, t in times.items():
        f, u = statistics.median(t["fused"]) * 1e3, statistics.median(t["unfused"]) * 1e3
        print(f"{name:<24}{f:>10.2f}{u:>12.2f}{u / f:>15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
