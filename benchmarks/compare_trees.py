#!/usr/bin/env python
"""Per-op launch cost of two source trees, alternated in rounds: a before/after check for the op path.

    git worktree add /tmp/base <commit>
    (cd /tmp/base && /path/to/.venv/bin/python setup.py build_ext --inplace)
    python benchmarks/compare_trees.py /tmp/base [--rounds 7] [--ops 2000]

Runs this tree's `benchmarks/async_launch.py --per-op` worker against each tree (that tree first on
PYTHONPATH, so it imports that tree's npudist and its built extensions; the measuring code is the same for
both, so an older tree is measured on every op this tree's worker knows), in both launch modes, as four long-lived
processes driven in alternating rounds (benchmarks/_alternate.py): machine noise hits all four alike.
Prints per op and launch mode the median microseconds per op of each tree and their ratio
(this tree / other tree; above 1.00 this tree is slower), and the cpu eager baseline measured in the
same workers.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
THIS_TREE = os.path.dirname(HERE)


def _worker(tree: str, blocking: str, ops: int) -> tuple[list[str], dict]:
    if not os.path.isdir(os.path.join(tree, "npudist")):
        raise SystemExit(f"{tree} has no npudist package: pass a source tree with its extensions built in place")
    script = os.path.join(HERE, "async_launch.py")
    env = dict(os.environ, PYTHONPATH=tree, ASCEND_LAUNCH_BLOCKING=blocking, NPUDIST_LAUNCH_BLOCKING=blocking)
    return [sys.executable, script, "--worker", "--per-op", "--ops", str(ops)], env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("other_tree", help="a source tree with its extensions built in place (e.g. a git worktree)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ops", type=int, default=2000, help="ops per timed loop")
    args = ap.parse_args(argv)
    other = os.path.abspath(args.other_tree)
    sys.path.insert(0, HERE)
    from _alternate import alternate
    workers = {(tree, mode): _worker(path, blocking, args.ops)
               for tree, path in (("other", other), ("this", THIS_TREE))
               for mode, blocking in (("async", "0"), ("blocking", "1"))}
    times = alternate(workers, args.rounds)
    print(f"microseconds per op (add, mm: 64x64 fp32; add_256k: 256x256 fp32), loops of {args.ops} ops then "
          f"synchronize; {args.rounds} alternating "
          f"rounds (medians); load average {os.getloadavg()[0]:.2f}")
    print(f"  this tree: {THIS_TREE}\n  other tree: {other}")
    print(f"  {'op':<8} {'mode':<9} {'other':>8} {'this':>8} {'this/other':>11} {'cpu':>7}")
    names = sorted({k.split("_", 1)[1] for ts in times.values() for t in ts for k in t if k.startswith("npu_")})
    for name in names:
        cpu = statistics.median(t[f"cpu_{name}"] for ts in times.values() for t in ts)
        for mode in ("async", "blocking"):
            med = {tree: statistics.median(t[f"npu_{name}"] for t in times[(tree, mode)]) for tree in ("other", "this")}
            print(f"  {name:<8} {mode:<9} {med['other']:8.2f} {med['this']:8.2f} {med['this'] / med['other']:10.2f}x "
                  f"{cpu:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
