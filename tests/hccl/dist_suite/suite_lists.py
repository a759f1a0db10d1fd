"""The checked-in lists of the DistributedTest driver and the comparison of a run against them.

gloo_passes_ws<N>.txt: the tests Gloo passes at world size N (its own skip rules).
expected_failures.txt: the tests Gloo passes and hccl does not, each with its reason (any world size).

    python suite_lists.py --write-gloo-passes results.jsonl --world-size 2   # refresh from a gloo run
"""
from __future__ import annotations

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED_FAILURES = os.path.join(HERE, "expected_failures.txt")


def gloo_passes_path(world_size: int) -> str:
    return os.path.join(HERE, f"gloo_passes_ws{world_size}.txt")


def read_gloo_passes(world_size: int) -> set[str]:
    with open(gloo_passes_path(world_size)) as f:
        return {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}


def read_expected_failures(path: str = EXPECTED_FAILURES) -> dict[str, str]:
    """{test: reason}; a line without a reason or a duplicate is an error."""
    out: dict[str, str] = {}
    with open(path) as f:
        for n, ln in enumerate(f, 1):
            if not ln.strip() or ln.startswith("#"):
                continue
            m = re.fullmatch(r"(test_\w+)\s+#\s*(\S.*)", ln.strip())
            if not m:
                raise ValueError(f"{path}:{n}: expected '<test name>  # <reason>', got {ln.strip()!r}")
            if m.group(1) in out:
                raise ValueError(f"{path}:{n}: {m.group(1)} is listed twice")
            out[m.group(1)] = m.group(2)
    return out


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


def compare(results: dict[str, dict], expected_names: list[str], gloo_passes: set[str],
            xfail: dict[str, str]) -> list[str]:
    """Problems of one run of `expected_names` against the lists; [] when the run matches them."""
    problems = []
    for name in expected_names:
        r = results.get(name)
        if r is None:
            problems.append(f"{name}: no result (the runner died or timed out before it)")
            continue
        outcome = r["outcome"]
        if name in xfail:
            if outcome != "failed":
                problems.append(f"{name}: listed in expected_failures.txt ({xfail[name]}) but {outcome}: "
                                "remove it from the list")
        elif outcome == "failed":
            problems.append(f"{name}: failed\n{r['detail'][-3000:]}")
        elif name in gloo_passes and outcome != "passed":
            problems.append(f"{name}: Gloo passes it but it was {outcome} ({r['detail'][:300]})")
    return problems


def main() -> int:
    args = sys.argv[1:]
    if len(args) != 4 or args[0] != "--write-gloo-passes" or args[2] != "--world-size":
        print(__doc__, file=sys.stderr)
        return 2
    path = gloo_passes_path(int(args[3]))
    passed = sorted(t for t, r in read_results(args[1])[1].items() if r["outcome"] == "passed")
    with open(path) as f:
        header = [ln for ln in f if ln.startswith("#")]
    with open(path, "w") as f:
        f.writelines(header)
        f.write("\n".join(passed) + "\n")
    print(f"{len(passed)} tests written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
