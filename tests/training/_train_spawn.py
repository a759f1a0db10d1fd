"""Run a function on N ranks (fresh spawned processes), with a hard timeout and cleanup."""
from __future__ import annotations

import os
import socket
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world, port, args, errfile):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    try:
        fn(rank, world, *args)
    except BaseException:
        with open(f"{errfile}.{rank}", "w") as f:
            f.write(traceback.format_exc())
        raise


def run_ranks(fn, world: int, args: tuple, tmpdir: str, timeout: float = 150.0) -> None:
    """Start ``fn(rank, world, *args)`` on ``world`` processes; raise with the first rank's traceback if any
    fails, or if they do not all finish within ``timeout`` seconds (then they are killed)."""
    ctx = mp.get_context("spawn")
    port, errfile = free_port(), os.path.join(tmpdir, "rank_error")
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args, errfile)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout)
            if p.is_alive():
                raise TimeoutError(f"rank did not finish within {timeout}s")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    for r in range(world):
        if os.path.exists(f"{errfile}.{r}"):
            raise RuntimeError(f"rank {r} failed:\n" + open(f"{errfile}.{r}").read())
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"ranks exited non-zero: {bad}")
