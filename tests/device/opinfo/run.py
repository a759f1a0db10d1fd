"""Command line: run op_db ops on npu vs cpu, in every form and launch mode, and report.

    python -m tests.device.opinfo.run --ops conj,polar --dtypes float32
    python -m tests.device.opinfo.run --max-samples 3 --check            # the CI subset, as one command
    python -m tests.device.opinfo.run --report full.txt --check          # the long run: every sample
    python -m tests.device.opinfo.run --modes blocking --ops nn.functional.mse_loss
    python -m tests.device.opinfo.run --write-expected                   # regenerate expected_failures.txt

``--ops name`` selects the op and its variants (``linalg.pinv`` also runs ``linalg.pinv.hermitian``).
With ``--max-samples K``, the forms the expected-failure list names for an op still run every sample, so
the list is judged on the same samples as in the long run (stale in either direction).
"""
import argparse
import json
import signal
import sys
import time

from . import expected
from .names import MODES
from .pool import Pool, Task
from .report import format_report


def select_tasks(catalog: dict, ops=None, dtypes=None, shard=(0, 1), more_forms=None) -> list:
    """Tasks for the chosen ops (all by default) in the chosen dtypes the CPU supports; ``more_forms``
    (op -> forms, "*" for all) names the forms that run every sample whatever the pool's sample limit."""
    names = sorted(catalog)
    if ops:
        unknown = [o for o in ops if not any(n == o or n.startswith(o + ".") for n in names)]
        if unknown:
            raise ValueError(f"unknown op(s) {unknown}; op ids are op_db names, e.g. 'conj', 'linalg.pinv.hermitian'")
        names = [n for n in names if any(n == o or n.startswith(o + ".") for o in ops)]
    index, count = shard
    names = names[index::count]
    tasks = []
    for n in names:
        ds = [d for d in catalog[n] if dtypes is None or d in dtypes]
        if ds:
            tasks.append(Task(n, ds, tuple(sorted((more_forms or {}).get(n, ())))))
    return tasks


def run_modes(modes, make_pool, choose_tasks, log=None):
    """Run the chosen tasks in a pool per launch mode; returns (records, tasks, catalog, restarts)."""
    records, restarts, tasks, catalog = [], 0, [], None
    for mode in modes:
        with make_pool(mode) as pool:
            catalog = pool.load_catalog()
            tasks = choose_tasks(catalog)
            for rec in pool.run(tasks):
                records.append(rec)
                if log is not None and rec["status"] != "agree":
                    print(f"{rec['status']:8} {rec['op']} {rec['dtype']} {mode}: {' '.join(rec['message'].split())}",
                          file=log, flush=True)
            restarts += pool.restarts
    return records, tasks, catalog, restarts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma list of op ids (default: every op of op_db)")
    p.add_argument("--dtypes", help="comma list of dtypes, e.g. float32,complex64 (default: every dtype "
                                    "the CPU supports for the op)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of launch modes (default: {','.join(MODES)})")
    p.add_argument("--max-samples", type=int, default=None,
                   help="first K samples per op x dtype for ops off the expected-failure list (default all)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per op x dtype before it is killed "
                                                                  "(grid_sampler_3d needs minutes per dtype)")
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th op starting at i")
    p.add_argument("--report", help="write the text report here (default: stdout)")
    p.add_argument("--json", help="write every op x dtype x mode record here")
    p.add_argument("--check", action="store_true", help="exit 1 on failures off the expected list or stale entries")
    p.add_argument("--write-expected", action="store_true", help="rewrite expected_failures.txt from this run "
                                                                   "(only meaningful for a run of every op)")
    a = p.parse_args(argv)
    ops = a.ops.split(",") if a.ops else None
    dtypes = set(a.dtypes.split(",")) if a.dtypes else None
    modes = a.modes.split(",")
    if any(m not in MODES for m in modes):
        p.error(f"--modes {a.modes}: expected a comma list of {MODES}")
    shard = tuple(int(x) for x in a.shard.split("/"))
    entries = expected.load()
    # SIGTERM unwinds like Ctrl-C, so the pool kills its workers and removes its socket directory
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    start = time.monotonic()
    records, tasks, catalog, restarts = run_modes(
        modes, lambda mode: Pool(a.workers, a.max_samples, a.timeout, mode=mode),
        lambda catalog: select_tasks(catalog, ops, dtypes, shard, more_forms=expected.listed_forms(entries)), log=sys.stderr)
    wall = time.monotonic() - start
    title = (f"OpInfo npu vs cpu: {len(tasks)} ops, max samples per op x dtype: {a.max_samples or 'all'} "
             f"(listed forms: all), modes {','.join(modes)}, {a.workers} workers, wall {wall:.0f} s, "
             f"worker restarts {restarts}")
    text = format_report(records, entries, title)
    if a.report:
        with open(a.report, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=0)
    if a.write_expected:
        with open(expected.PATH) as f:
            header = "".join(line for line in f if line.startswith("#"))
        expected.write(records, entries, header=header)
    if a.check:
        problems = expected.check(records, entries, {t.op for t in tasks}, catalog if ops is None else None)
        for pr in problems:
            print(pr, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
