"""The physical references of benchmarks/collectives.py, measured in the same interleaved rounds as the ops:
the memcpy roofline R (every rank copies between two private buffers at once) and the cross-memory-attach
rate (every rank reads a peer's private buffer with process_vm_readv at once), whose ratio rho prices the
single-copy route for cpu tensors (docs/hccl_engine.md, "Copy-bound ceilings")."""
from __future__ import annotations

import os
import statistics
import sys
import threading
import time

PROBE_BYTES = 64 << 20  # per rank: far beyond the caches, as the ceiling assumes


def make_memcpy():
    import torch

    src, dst = torch.ones(PROBE_BYTES, dtype=torch.uint8), torch.empty(PROBE_BYTES, dtype=torch.uint8)
    return lambda: dst.copy_(src)


def make_cma_reader(rank: int, n: int, group):
    """Every rank reads PROBE_BYTES of the next rank's private buffer with process_vm_readv (one call, as
    the engine's direct mode reads a peer's buffer), or None on every rank if any rank is refused (ptrace
    policy, seccomp): then only the staged route exists. The buffers live until the process exits, since a
    peer may read this rank's source at any time during the run."""
    import ctypes

    import torch
    import torch.distributed as dist

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    readv = ctypes.CDLL(None, use_errno=True).process_vm_readv
    readv.restype = ctypes.c_ssize_t
    readv.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.POINTER(IoVec), ctypes.c_ulong,
                      ctypes.c_ulong]
    src, dst = torch.ones(PROBE_BYTES, dtype=torch.uint8), torch.zeros(PROBE_BYTES, dtype=torch.uint8)
    peers = [None] * n
    dist.all_gather_object(peers, (os.getpid(), src.data_ptr()), group=group)
    pid, addr = peers[(rank + 1) % n]

    def read():
        done = 0
        while done < PROBE_BYTES:
            left = PROBE_BYTES - done
            got = readv(pid, ctypes.byref(IoVec(dst.data_ptr() + done, left)), 1,
                        ctypes.byref(IoVec(addr + done, left)), 1, 0)
            if got <= 0:
                err = ctypes.get_errno()
                raise OSError(err, f"process_vm_readv of rank {(rank + 1) % n}: {os.strerror(err)}")
            done += got

    ok = torch.ones(1)
    try:
        read()  # also faults in the destination pages
        ok[0] = float(dst[-1] == 1)
    except OSError as e:
        print(f"rank {rank}: cross-memory attach refused ({e}); the platform ceiling is the staged route",
              file=sys.stderr, flush=True)
        ok[0] = 0
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    if not ok[0]:
        return None
    read.buffers = (src, dst)
    return read


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
