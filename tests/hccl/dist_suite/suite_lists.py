"""The checked-in lists of the DistributedTest driver and the comparison of a run against them.

Per half (runner.py --tensors cpu|npu):
  cpu: gloo_passes_ws<N>.txt   the tests Gloo passes at world size N (its own skip rules);
       expected_failures.txt   the tests Gloo passes and hccl does not, each with its reason.
  npu: npu_passes_ws<N>.txt    the tests the device half passes at world size N (no CUDA here to
                               run NCCL for a reference): one that stops passing, or one that starts
                               (a skip or failure went away), makes the list stale;
       expected_failures_npu.txt  the tests the device half runs and fails, each with its reason;
       npu_long.txt            tests left out of CI for their run time (each with its reason); the
                               documented long run (docs/hccl.md) includes them.
An expected-failure line may name world sizes: `test_x  [ws=4]  # reason` holds at 4 ranks only.

    python suite_lists.py --write-passes results.jsonl --tensors npu --world-size 2   # refresh a pass list
    python suite_lists.py --check results.jsonl --tensors npu --world-size 4          # compare a run
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED_FAILURES = {"cpu": os.path.join(HERE, "expected_failures.txt"),
                     "npu": os.path.join(HERE, "expected_failures_npu.txt")}
LONG = {"cpu": None, "npu": os.path.join(HERE, "npu_long.txt")}


def passes_path(tensors: str, world_size: int) -> str:
    return os.path.join(HERE, f"{'gloo' if tensors == 'cpu' else 'npu'}_passes_ws{world_size}.txt")


def read_passes(tensors: str, world_size: int) -> set[str]:
    with open(passes_path(tensors, world_size)) as f:
        return {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}


def read_reasoned(path: str | None, world_size: int | None = None) -> dict[str, str]:
    """{test: reason} of a list of `<test name> [ws=N,...]  # <reason>` lines; with `world_size`, only
    the lines that hold at it. A line without a reason or a duplicate is an error (a test listed per
    world size is read with one)."""
    out: dict[str, str] = {}
    if path is None:
        return out
    with open(path) as f:
        for n, ln in enumerate(f, 1):
            if not ln.strip() or ln.startswith("#"):
                continue
            m = re.fullmatch(r"(test_\w+)\s+(?:\[ws=([\d,]+)\]\s+)?#\s*(\S.*)", ln.strip())
            if not m:
                raise ValueError(f"{path}:{n}: expected '<test name> [ws=N]  # <reason>', got {ln.strip()!r}")
            name, sizes, reason = m.groups()
            if world_size is not None and sizes is not None and str(world_size) not in sizes.split(","):
                continue
            if name in out:
                raise ValueError(f"{path}:{n}: {name} is listed twice")
            out[name] = reason
    return out


def read_expected_failures(tensors: str = "cpu", world_size: int | None = None) -> dict[str, str]:
    return read_reasoned(EXPECTED_FAILURES[tensors], world_size)


def read_long(tensors: str) -> dict[str, str]:
    return read_reasoned(LONG[tensors])


def read_results(path: str) -> tuple[list[str], dict[str, dict]]:
    """(the tests the runner selected, {test: result}) from a runner's output file."""
    selected: list[str] = []
    results: dict[str, dict] = {}
    with open(path) as f:
        for rec in map(json.loads, filter(str.strip, f)):
            if "selected" in rec:
                selected += rec["selected"]
            else:
                results[rec["test"]] = rec
    return selected, results


def compare(results: dict[str, dict], expected_names: list[str], passes: set[str],
            xfail: dict[str, str], passes_exact: bool = False) -> list[str]:
    """Problems of one run of `expected_names` against the lists; [] when the run matches them.
    `passes` must pass; with `passes_exact`, a test off `passes` and off `xfail` must not pass either."""
    problems = []
    for name in expected_names:
        r = results.get(name)
        if r is None:
            problems.append(f"{name}: no result (the runner died or timed out before it)")
            continue
        outcome = r["outcome"]
        if name in xfail:
            if outcome != "failed":
                problems.append(f"{name}: listed as an expected failure ({xfail[name]}) but {outcome}: "
                                "remove it from the list")
        elif outcome == "failed":
            problems.append(f"{name}: failed\n{r['detail'][-3000:]}")
        elif name in passes and outcome != "passed":
            problems.append(f"{name}: on the pass list but it was {outcome} ({r['detail'][:300]})")
        elif passes_exact and name not in passes and outcome == "passed":
            problems.append(f"{name}: passed but is not on the pass list: add it (suite_lists.py --write-passes)")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write-passes", metavar="RESULTS")
    mode.add_argument("--check", metavar="RESULTS")
    ap.add_argument("--tensors", choices=["cpu", "npu"], default="cpu")
    ap.add_argument("--world-size", type=int, required=True)
    args = ap.parse_args()
    if args.write_passes:
        path = passes_path(args.tensors, args.world_size)
        passed = sorted(t for t, r in read_results(args.write_passes)[1].items() if r["outcome"] == "passed")
        with open(path) as f:
            header = [ln for ln in f if ln.startswith("#")]
        with open(path, "w") as f:
            f.writelines(header)
            f.write("\n".join(passed) + "\n")
        print(f"{len(passed)} tests written to {path}")
        return 0
    names, results = read_results(args.check)
    problems = compare(results, names, read_passes(args.tensors, args.world_size),
                       read_expected_failures(args.tensors, args.world_size), passes_exact=args.tensors == "npu")
    counts = {k: sum(r["outcome"] == k for r in results.values()) for k in ("passed", "failed", "skipped")}
    print(f"{len(names)} tests selected: {counts}; {len(problems)} problems")
    for p in problems:
        print("\n" + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
