"""Runs PyTorch's DistributedTest suite (torch/testing/_internal/distributed/distributed_test.py, the
class behind PyTorch's test_distributed_spawn.py) from the installed wheel against one backend and
writes a JSON line {"selected": [names]} and then one per test: {"test", "outcome":
passed|failed|skipped, "seconds", "detail"}.

    python runner.py --backend hccl --world-size 2 --out results.jsonl [--shard 0/4] [test_name ...]
    python runner.py --list

Gloo's skip rules: the suite decides most skips when the module is imported, from the BACKEND
environment variable. We import it with BACKEND=gloo, so exactly the tests Gloo runs are run, then
point the module's BACKEND global at the backend under test: init_process_group and the test bodies
read that global at run time. Tests whose body only knows named backends (BODY_AS_GLOO) see "gloo"
once their process group exists, so they run Gloo's code path on the backend under test.

Test processes are forked from this runner, which imports torch and npudist but never touches the
npu runtime: a fork costs a fraction of the suite's usual spawn (which re-imports torch per rank).
Each test's ranks are bounded by the suite's own join timeout (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import unittest

# The accumulate-gradients helper builds its model only under `if BACKEND == "mpi" or BACKEND == "gloo"`
# (and "nccl"); with any other name the body fails with UnboundLocalError before communicating.
BODY_AS_GLOO = {
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_accumulate_gradients_no_sync_grad_is_view",
}


def import_suite(backend: str, world_size: int):
    os.environ["BACKEND"] = "gloo"
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    import torch.multiprocessing

    import npudist  # noqa: F401  (registers the npu device and the hccl backend)
    from torch.testing._internal.distributed import distributed_test as dt

    dt.BACKEND = backend

    class TestDistBackendWithFork(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

        def run_test(self, test_name, parent_pipe):
            # Runs in the rank's process after init_process_group(backend) succeeded.
            if test_name in BODY_AS_GLOO:
                dt.BACKEND = "gloo"
            super().run_test(test_name, parent_pipe)

    return TestDistBackendWithFork


class JsonResult(unittest.TestResult):
    def __init__(self, out):
        super().__init__()
        self.out = out
        self.t0 = 0.0

    def startTest(self, test):
        super().startTest(test)
        self.t0 = time.monotonic()

    def _emit(self, test, outcome, detail=""):
        rec = {"test": test.id().split(".")[-1], "outcome": outcome,
               "seconds": round(time.monotonic() - self.t0, 2), "detail": detail[-4000:]}
        self.out.write(json.dumps(rec) + "\n")
        self.out.flush()
        print(f"{rec['test']}: {outcome} ({rec['seconds']} s)", file=sys.stderr, flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._emit(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._emit(test, "failed", self.failures[-1][1])

    def addError(self, test, err):
        super().addError(test, err)
        self._emit(test, "failed", self.errors[-1][1])

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._emit(test, "skipped", str(reason))


def select_shard(names: list[str], shard: str | None) -> list[str]:
    if not shard:
        return names
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise SystemExit(f"--shard must look like I/N (e.g. 0/4), got {shard!r}") from None
    if not 0 <= i < n:
        raise SystemExit(f"--shard {shard}: I must be in [0, N)")
    return names[i::n]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="hccl")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--out", default="-")
    ap.add_argument("--shard", help="I/N: run every N-th test starting at I (sorted names)")
    ap.add_argument("--list", action="store_true", help="print the suite's test names and exit")
    ap.add_argument("tests", nargs="*")
    args = ap.parse_args()
    cls = import_suite(args.backend, args.world_size)
    names = select_shard(args.tests or sorted(unittest.TestLoader().getTestCaseNames(cls)), args.shard)
    if args.list:
        print("\n".join(names))
        return 0
    out = sys.stdout if args.out == "-" else open(args.out, "a")
    out.write(json.dumps({"selected": names}) + "\n")
    out.flush()
    unittest.TestSuite(cls(n) for n in names).run(JsonResult(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
