"""Run a function on N spawned ranks (gloo or hccl) with a hard timeout; collect each rank's result."""
from __future__ import annotations

import os
import queue
import socket
import traceback

import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, backend, fn, args, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    import datetime

    import torch.distributed as dist
    try:
        if backend == "hccl":
            import torch

            import npudist
            npudist.register()   # npu device + hccl backend (done by `import torch` unless autoload is off)
            torch.npu.set_device(rank)   # as npurun's worker bootstrap does (LOCAL_RANK)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        try:
            out.put((rank, "ok", fn(rank, world, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - report any failure to the parent instead of hanging it
        out.put((rank, "error", traceback.format_exc()))


def run_ranks(fn, world: int, *args, backend: str = "gloo", timeout: float = 120.0) -> list:
    """fn(rank, world, *args) on every rank; returns results by rank, raises with the first rank's
    traceback on failure, kills every process after ``timeout`` seconds."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, backend, fn, args, out), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors = []
    try:
        import time
        deadline = time.monotonic() + timeout
        while len(results) + len(errors) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"ranks did not finish within {timeout}s "
                                   f"(done: {sorted(results)}, failed: {[r for r, _ in errors]})")
            try:
                rank, status, value = out.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and i not in results and i not in [r for r, _ in errors]]
                if dead:
                    raise RuntimeError(f"rank(s) {dead} died with exit codes "
                                       f"{[procs[i].exitcode for i in dead]}")
                continue
            if status == "ok":
                results[rank] = value
            else:
                errors.append((rank, value))
        if errors:
            rank, tb = sorted(errors)[0]
            raise RuntimeError(f"rank {rank} failed:\n{tb}")
        return [results[r] for r in range(world)]
    finally:
        for p in procs:
            p.join(timeout=10)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

