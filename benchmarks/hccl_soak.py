"""Long seeded randomized soak of the hccl backend (the bounded version runs in CI: tests/hccl/test_soak.py).

Runs the random programs of tests/hccl/soak.py seed after seed, alternating the world sizes, until the time
budget is spent; every value is checked on every rank against its closed form. After each run it checks that
nothing of the job is left in /dev/shm. Prints one line per run and a summary: ops, ranks, minutes, wrong
values, errors (a false "mismatched collectives" is one), hangs.

Usage:
    python benchmarks/hccl_soak.py --minutes 30                     # world sizes 2 and 4, 1500 ops per seed
    python benchmarks/hccl_soak.py --world-size 4 --seed 7 --ops 120  # replay a failure printed by a run
    python benchmarks/hccl_soak.py --minutes 60 --max-kib 33792     # up to 33 MiB: every engine threshold
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "hccl"))

from launcher import run_ranks  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=0.0, help="time budget; 0 = one run per world size")
    p.add_argument("--world-size", type=int, action="append", help="repeatable; default 2 and 4")
    p.add_argument("--seed", type=int, default=None, help="first seed (default: from the clock)")
    p.add_argument("--ops", type=int, default=1500, help="ops per seed")
    p.add_argument("--max-kib", type=int, default=33792, help="largest buffer of an op, KiB")
    p.add_argument("--timeout", type=float, default=900.0, help="per run; a run that exceeds it is a hang")
    a = p.parse_args()
    sizes = a.world_size or [2, 4]
    seed = a.seed if a.seed is not None else int(time.time()) % 100000
    t0 = time.monotonic()
    program_ops = rank_ops = runs = wrong = errors = hangs = shm_leaks = 0
    while True:
        for ws in sizes:
            start = time.monotonic()
            try:
                results = run_ranks("soak", ws, args=(str(seed), a.ops, a.max_kib), timeout=a.timeout,
                                    expect_ok=False)
            except AssertionError as e:  # timed out (a hang) or shared memory left behind
                hangs += "timed out" in str(e)
                shm_leaks += "left shared memory" in str(e)
                print(f"FAIL world={ws} seed={seed}: {str(e)[:3000]}", flush=True)
                results = []
            out = "\n".join(r.output for r in results)
            done = [int(x) for x in re.findall(r"SOAK DONE .*executed=(\d+)", out)]
            failures = [line for line in out.splitlines() if line.startswith("SOAK FAILURE")]
            wrong += any("AssertionError" in line for line in failures)
            failed = bool(failures) or len(done) != ws or any(r.returncode != 0 for r in results)
            errors += failed
            if failed and results:
                print("\n".join(failures[:4]) or out[-3000:], flush=True)
            runs += 1
            program_ops += a.ops if not failed else 0
            rank_ops += sum(done)
            print(f"run {runs}: world={ws} seed={seed} program={a.ops} ops, {sum(done)} rank-ops, "
                  f"{time.monotonic() - start:.0f}s {'FAIL' if failed else 'ok'}", flush=True)
        seed += 1
        if time.monotonic() - t0 >= a.minutes * 60:
            break
    minutes = (time.monotonic() - t0) / 60
    print(f"SUMMARY: {runs} runs, world sizes {sizes}, {program_ops} ops in passing programs "
          f"({rank_ops} rank-ops checked), {minutes:.1f} min; failed runs {errors} (wrong values in {wrong}), "
          f"hangs {hangs}, runs that left /dev/shm entries {shm_leaks}", flush=True)
    return 0 if not (errors or hangs or shm_leaks) else 1


if __name__ == "__main__":
    sys.exit(main())
