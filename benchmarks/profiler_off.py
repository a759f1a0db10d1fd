"""What the npu profiler hooks cost when no profiler is active: this build against a baseline build.

The hooks (device_core/profiler/profiler.h: one relaxed atomic load per kernel, copy and collective, a
thread-local check per allocation) cannot be switched off inside one build, so the baseline is another
build of npudist without them (e.g. main's checkout): `--baseline DIR` is put first on PYTHONPATH of the
baseline's runs. Both sides run the same tiny npu ops (where a fixed per-op cost shows most) in fresh
subprocesses, alternated round by round; per-op medians and the this/baseline ratio are printed.

    .venv/bin/python benchmarks/profiler_off.py --baseline /path/to/baseline/checkout [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITERS = 4000


def _measure() -> dict[str, float]:
    import torch

    import npudist  # noqa: F401

    torch.set_num_threads(1)
    s = torch.randn(100, device="npu")
    u = torch.randn(100, device="npu")
    w = torch.randn(16, 16, device="npu")
    x = torch.randn(4, 16, device="npu")
    cases = {
        "tiny add (new output)": lambda: torch.add(s, u),
        "tiny add_ (in-place)": lambda: s.add_(u),
        "tiny relu": lambda: torch.relu(s),
        "small linear": lambda: torch.nn.functional.linear(x, w),
        "empty + free": lambda: torch.empty(256, device="npu"),
    }
    out = {}
    for name, fn in cases.items():
        for _ in range(200):
            fn()
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(ITERS):
                fn()
            best.append((time.perf_counter() - t0) / ITERS * 1e6)
        out[name] = statistics.median(best)
    return out


def _run(pythonpath: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], env=env, capture_output=True,
                       text=True, timeout=600, cwd="/")
    if r.returncode != 0:
        raise RuntimeError(f"benchmark worker failed (PYTHONPATH={pythonpath}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--baseline", help="directory whose npudist package is the baseline build")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(_measure()))
        return
    if not args.baseline:
        p.error("--baseline DIR is required (a checkout or package directory holding the baseline npudist)")
    sides = {"baseline": args.baseline, "this build": REPO}
    samples: dict[str, dict[str, list[float]]] = {k: {} for k in sides}
    for r in range(args.rounds):
        for side, path in (sides.items() if r % 2 == 0 else reversed(list(sides.items()))):
            for case, us in _run(path).items():
                samples[side].setdefault(case, []).append(us)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{args.rounds} alternated rounds, medians of per-op time (us); baseline: {args.baseline}")
    print(f"{'case':26s} {'baseline':>10s} {'this build':>11s} {'ratio':>7s} {'added':>9s}")
    for case in samples["baseline"]:
        b = statistics.median(samples["baseline"][case])
        t = statistics.median(samples["this build"][case])
        print(f"{case:26s} {b:10.3f} {t:11.3f} {t / b:6.3f}x {t - b:+8.3f}")


if __name__ == "__main__":
    main()
