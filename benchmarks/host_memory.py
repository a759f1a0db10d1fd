"""Benchmark of the caching host allocator (pinned memory) and of allocation inside a MemPool.

  1. pinned: `torch.empty(n, pin_memory=True)`, one write per 4 KiB page (as a copy into it would), then
     free; "cached" reuses the freed block, "uncached" calls torch.npu.host_empty_cache() after every free,
     so each allocation reaches the host allocator's malloc and first-touch page faults (what pinned memory
     cost before the cache);
  2. mempool: `torch.empty(n, device="npu")` + free, on the default pools against inside use_mem_pool.

The two sides of each pair alternate round by round in one process; medians over rounds, microseconds per
allocation. Usage: python benchmarks/host_memory.py [--rounds 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import npudist  # noqa: F401

KiB, MiB = 1 << 10, 1 << 20


def pinned_us(n: int, iters: int, cached: bool) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        x = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        x[::4096] = 1
        del x
        if not cached:
            torch.npu.host_empty_cache()
    return (time.perf_counter() - t0) / iters * 1e6


def npu_alloc_us(n: int, iters: int, pool) -> float:
    t0 = time.perf_counter()
    if pool is None:
        for _ in range(iters):
            x = torch.empty(n, dtype=torch.uint8, device="npu")
            del x
    else:
        with torch.npu.use_mem_pool(pool):
            for _ in range(iters):
                x = torch.empty(n, dtype=torch.uint8, device="npu")
                del x
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    pool = torch.npu.MemPool()
    cases = []
    for n, iters in ((4 * KiB, 2000), (1 * MiB, 300), (64 * MiB, 10)):
        cases.append((f"pinned {n // KiB} KiB", lambda n=n, i=iters: pinned_us(n, i, False),
                      lambda n=n, i=iters: pinned_us(n, i, True), "uncached", "cached"))
    for n in (4 * KiB, 4 * MiB):
        cases.append((f"npu alloc {n // KiB} KiB", lambda n=n: npu_alloc_us(n, 2000, None),
                      lambda n=n: npu_alloc_us(n, 2000, pool), "default pool", "MemPool"))
    for name, base, new, base_name, new_name in cases:
        base(), new()  # warm-up
        a, b = [], []
        for _ in range(args.rounds):
            a.append(base())
            b.append(new())
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{name:>20}: {base_name} {ma:9.1f} us, {new_name} {mb:9.1f} us ({ma / mb:.2f}x)")


if __name__ == "__main__":
    main()
