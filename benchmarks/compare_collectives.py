#!/usr/bin/env python
"""hccl's collectives on two source trees, alternated in one run: a before/after check for benchmarks/collectives.py.

    git worktree add /tmp/base <commit>
    (cd /tmp/base && /path/to/.venv/bin/python setup.py build_ext --inplace)
    python benchmarks/compare_collectives.py /tmp/base [--runs 3] [--world-sizes 2] [--sizes 8,65536,1048576]

Runs this tree's collectives.py workers against each tree (that tree first on PYTHONPATH, so its npudist and
built extensions are measured by the same measuring code), whole benchmark runs alternating between the trees
(other, this, this, other, ...), so drift of the machine's load hits both alike. Prints, per ranks x op x
tensors x size, the median over runs of hccl's time per op on each tree and their ratio (this / other: above
1.00 this tree is slower), and the same ratio after dividing each run's hccl time by the Gloo time measured in
that run ("vs gloo"), which also cancels load changes between runs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
THIS_TREE = os.path.dirname(HERE)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("other_tree", help="a source tree with its extensions built in place (e.g. a git worktree)")
    ap.add_argument("--runs", type=int, default=3, help="benchmark runs per tree")
    ap.add_argument("--world-sizes", default="2")
    ap.add_argument("--ops", default=None, help="comma-separated (default: every op of collectives.py)")
    ap.add_argument("--devices", default="cpu,npu")
    ap.add_argument("--sizes", default="8,65536,1048576,16777216")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds inside each run (collectives.py)")
    args = ap.parse_args(argv)
    other = os.path.abspath(args.other_tree)
    if not os.path.isdir(os.path.join(other, "npudist")):
        raise SystemExit(f"{other} has no npudist package: pass a source tree with its extensions built in place")
    sys.path.insert(0, HERE)
    import collectives as bench

    bargs = argparse.Namespace(ops=(args.ops.split(",") if args.ops else bench.OPS), devices=args.devices.split(","),
                               sizes=[int(x) for x in args.sizes.split(",")], rounds=args.rounds,
                               round_seconds=0.05, max_iters=2000, timeout=3600)
    trees = {"other": other, "this": THIS_TREE}
    rows: dict[str, list[dict]] = {"other": [], "this": []}
    order = ["other", "this"]
    for run in range(args.runs):
        for name in (order if run % 2 == 0 else order[::-1]):
            print(f"\n== run {run + 1}/{args.runs}: {name} tree ({trees[name]}), load {os.getloadavg()[0]:.2f}",
                  flush=True)
            for n in [int(x) for x in args.world_sizes.split(",")]:
                for row in bench.run_world(n, bargs, tree=trees[name]):
                    rows[name].append(dict(row, run=run))
    print(f"\nhccl us per op, median over {args.runs} runs per tree (each the median of {args.rounds} rounds); "
          f"this: {THIS_TREE}, other: {other}")
    print(f"{'ranks':>5} {'op':<25} {'dev':>3} {'size':>8} {'other':>9} {'this':>9} {'this/other':>10} "
          f"{'vs gloo':>8}")
    keys = sorted({(r["n"], r["op"], r["bytes"]) for r in rows["this"]})
    worst = 0.0
    for n, op, size in keys:
        for dev in bargs.devices:
            def pick(tree, field):
                return [r[field] for r in rows[tree] if (r["n"], r["op"], r["bytes"]) == (n, op, size)]
            t = {k: statistics.median(pick(k, f"hccl_{dev}_s")) for k in trees}
            g = {k: statistics.median(a / b for a, b in zip(pick(k, f"hccl_{dev}_s"), pick(k, "gloo_s")))
                 for k in trees}
            ratio, norm = t["this"] / t["other"], g["this"] / g["other"]
            worst = max(worst, min(ratio, norm))
            print(f"{n:>5} {op:<25} {dev:>3} {bench.fmt_bytes(size):>8} {t['other'] * 1e6:9.1f} "
                  f"{t['this'] * 1e6:9.1f} {ratio:9.2f}x {norm:7.2f}x", flush=True)
    print(f"\nlargest slowdown (the smaller of the two ratios, per point): {worst:.2f}x; load average "
          f"{os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
