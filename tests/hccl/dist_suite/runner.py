"""Runs PyTorch's DistributedTest suite (torch/testing/_internal/distributed/distributed_test.py, the
class behind PyTorch's test_distributed_spawn.py) from the installed wheel against one backend and
writes a JSON line {"selected": [names]} and then one per test: {"test", "outcome":
passed|failed|skipped, "seconds", "detail"}.

    python runner.py --backend hccl --world-size 2 --out results.jsonl [--shard 0/4] [test_name ...]
    python runner.py --backend hccl --tensors npu --world-size 2 ...     # the device-path half
    python runner.py --list [--tensors npu]

The suite decides most skips when the module is imported, from the BACKEND environment variable, and
its test bodies read the module's BACKEND global at run time. Two halves:

* cpu tensors (default), Gloo's skip rules: the module is imported with BACKEND=gloo, so exactly the
  tests Gloo runs are run, then its BACKEND global is pointed at the backend under test
  (init_process_group and the bodies read it). Tests whose body only knows named backends
  (BODY_AS_RULES) see "gloo" once their process group exists, so they run Gloo's code path.
* npu tensors (--tensors npu), NCCL's skip rules, as torch_npu runs this suite with hccl: the module is
  imported with BACKEND=nccl, so the device-path tests run (`*_cuda`, DDP with device_ids, device-tensor
  collectives) and the cpu-tensor ones NCCL refuses are skipped; the suite's CUDA calls go to the npu
  (route_cuda_to_npu, the only place that does it); BACKEND is then the backend under test, and
  BODY_AS_RULES bodies see "nccl".

Either way hccl is added to the suite's lists of backends whose profiler events it checks.

Test processes are forked from this runner, which imports torch and npudist but never touches the
npu runtime: a fork costs a fraction of the suite's usual spawn (which re-imports torch per rank).
Each test's ranks are bounded by the suite's own join timeout (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import types
import unittest

# Tests whose body builds its model only under `if BACKEND == "mpi" or BACKEND == "gloo"` (and "nccl"):
# with any other name the body fails with UnboundLocalError before communicating. They see the name of
# the half's rules ("gloo" or "nccl") once their process group exists.
BODY_AS_RULES = {
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_accumulate_gradients_no_sync_grad_is_view",
}
RULES = {"cpu": "gloo", "npu": "nccl"}  # tensors -> the backend whose skip rules select the tests

# s between checks in the harness's polling loops (poll_faster); the harness's own is 0.1.
POLL_INTERVAL = 0.01

# The suite gates NCCL features by NCCL's version (send/recv needs 2.7); hccl has all of them.
NCCL_VERSION_STANDIN = (2, 7, 0)


def _npu_device(dev):
    """"cuda", "cuda:1", torch.device("cuda", 1) -> the same on npu; anything else unchanged."""
    import torch

    if isinstance(dev, str) and (dev == "cuda" or dev.startswith("cuda:")):
        return "npu" + dev[4:]
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("npu", dev.index)
    if isinstance(dev, dict):  # torch.load's map_location
        return {_npu_device(k): _npu_device(v) for k, v in dev.items()}
    return dev


def route_cuda_to_npu(dt_common):
    """The suite's CUDA calls, redirected to the npu: the one place where the device-path half maps
    cuda to npu, as torch_npu does for its own runs of this suite. npudist itself never does this.

    `dt_common` is torch.testing._internal.common_distributed, patched here before the suite module is
    imported (its skip decorators run at import); the suite module itself is patched by
    route_suite_to_npu once imported. Inside those two modules only:
      - `torch.cuda` is torch.npu (which mirrors it) and reports the npu devices, with NCCL's version
        standing in for hccl's where a decorator asks;
      - `torch.device(...)`, and the `device=` / `map_location=` arguments of torch's functions, turn
        cuda into npu;
      - `c10d.is_nccl_available()` is true and TEST_CUDA is set: hccl on npu plays NCCL on CUDA, and
        a group the suite asks for by the name "nccl" is an hccl group (torch.distributed's own
        `is_nccl_available` answers true only while the suite module is imported, for its decorators).
    ProfilerActivity.CUDA stays CUDA (it records nothing on this build): the suite's checks read the
    CPU-side "hccl:<op>" events and leave out device-side ones.
    Process-wide (harmless: this torch build has no CUDA, so these could only raise):
      - `Tensor.cuda` / `nn.Module.cuda` are `.npu`; `init_device_mesh("cuda", ...)` builds an npu mesh.
    """
    import torch
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import torch.nn as nn

    cuda = types.ModuleType("torch.cuda (npu)")
    cuda.__getattr__ = lambda name: getattr(torch.npu, name)
    cuda.nccl = types.SimpleNamespace(version=lambda: NCCL_VERSION_STANDIN)

    def device(*args, **kwargs):
        return torch.device(*(_npu_device(a) for a in args), **kwargs)

    def mapped(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            for k in ("device", "map_location"):
                if k in kwargs:
                    kwargs[k] = _npu_device(kwargs[k])
            return fn(*args, **kwargs)
        return call

    suite_torch = types.ModuleType("torch (cuda -> npu)")
    special = {"cuda": cuda, "device": device}

    def torch_attr(name):
        if name in special:
            return special[name]
        attr = getattr(torch, name)
        return mapped(attr) if isinstance(attr, types.BuiltinFunctionType) or name == "load" else attr

    suite_torch.__getattr__ = torch_attr

    c10d = types.ModuleType("torch.distributed (nccl = hccl)")
    c10d.__getattr__ = lambda name: getattr(dist, name)
    c10d.is_nccl_available = lambda: True

    dt_common.torch = suite_torch
    dt_common.c10d = c10d
    dt_common.TEST_CUDA = True

    torch.Tensor.cuda = lambda self, device=None, non_blocking=False, **kw: self.npu(device, non_blocking, **kw)
    nn.Module.cuda = lambda self, device=None: self.npu(device)
    real_mesh = device_mesh.init_device_mesh
    device_mesh.init_device_mesh = lambda device_type, *a, **kw: real_mesh(_npu_device(device_type), *a, **kw)
    return suite_torch


def route_suite_to_npu(dt, suite_torch, backend: str):
    """The suite module's share of route_cuda_to_npu: its `torch` global, the CUDA names it imported, and
    groups it creates by NCCL's name (`new_group(backend="nccl")`), which are `backend` groups."""
    import torch
    import torch.distributed as dist

    def named_nccl(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if kwargs.get("backend") == "nccl":
                kwargs["backend"] = backend
            return fn(*args, **kwargs)
        return call

    suite_dist = types.ModuleType("torch.distributed (nccl = hccl)")
    wrapped = {name: named_nccl(getattr(dist, name)) for name in ("new_group", "init_process_group")}
    suite_dist.__getattr__ = lambda name: wrapped.get(name) or getattr(dist, name)
    dt.dist = suite_dist
    dt.torch = suite_torch
    dt.autocast = functools.partial(torch.autocast, "npu")
    dt.GradScaler = functools.partial(torch.amp.GradScaler, "npu")


def import_suite_on_npu(common_distributed, backend: str):
    """The suite module, imported and routed to the npu (route_cuda_to_npu, then route_suite_to_npu)."""
    import torch.distributed as dist

    suite_torch = route_cuda_to_npu(common_distributed)
    # The suite's import-time `require_backend_is_available` asks torch.distributed itself.
    real_is_nccl_available, dist.is_nccl_available = dist.is_nccl_available, lambda: True
    try:
        from torch.testing._internal.distributed import distributed_test as dt
    finally:
        dist.is_nccl_available = real_is_nccl_available
    route_suite_to_npu(dt, suite_torch, backend)
    return dt


def poll_faster(dt, common_distributed, interval: float = POLL_INTERVAL):
    """The harness's two polling loops wake every `interval` s instead of every 0.1 s: the parent's wait for
    its ranks to exit (MultiProcessTestCase._join_processes) and the ranks' file barrier before and after each
    test body (Barrier.sync). Each test paid up to 0.1 s at each of the three, most of a short test's time.
    Every other sleep of the two modules (a test's own, e.g. the timeout tests') keeps its length: the
    shortening applies to calls made from those two functions only."""
    loops = {common_distributed.MultiProcessTestCase._join_processes.__code__, dt.Barrier.sync.__func__.__code__}

    def sleep(seconds):
        if sys._getframe(1).f_code in loops:
            seconds = min(seconds, interval)
        time.sleep(seconds)

    harness_time = types.ModuleType("time (harness polls faster)")
    harness_time.__getattr__ = lambda name: getattr(time, name)
    harness_time.sleep = sleep
    dt.time = common_distributed.time = harness_time


def import_suite(backend: str, world_size: int, tensors: str = "cpu"):
    rules = RULES[tensors]
    os.environ["BACKEND"] = rules
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    import torch.multiprocessing

    import npudist  # noqa: F401  (registers the npu device and the hccl backend)
    from torch.testing._internal import common_distributed

    if tensors == "npu":
        dt = import_suite_on_npu(common_distributed, backend)
    else:
        from torch.testing._internal.distributed import distributed_test as dt
    dt.BACKEND = backend
    poll_faster(dt, common_distributed)
    # The suite checks the profiler events of the backends on these lists (names, counts, shapes).
    for allow in (dt.PROFILING_SUPPORTED_BACKENDS, dt.CUDA_PROFILING_SUPPORTED_BACKENDS,
                  dt.SEND_RECV_PROFILING_SUPPORTED_BACKENDS):
        if backend not in allow:
            allow.append(backend)

    class TestDistBackendWithFork(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

        def run_test(self, test_name, parent_pipe):
            # Runs in the rank's process after init_process_group(backend) succeeded.
            if test_name in BODY_AS_RULES:
                dt.BACKEND = rules
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
    ap.add_argument("--tensors", choices=sorted(RULES), default="cpu",
                    help="cpu: Gloo's skip rules; npu: NCCL's, the suite's CUDA calls on the npu")
    ap.add_argument("--out", default="-")
    ap.add_argument("--shard", help="I/N: run every N-th test starting at I (sorted names)")
    ap.add_argument("--skip-long", action="store_true",
                    help="leave out the tests of the half's long list (npu_long.txt), as CI does")
    ap.add_argument("--list", action="store_true", help="print the suite's test names and exit")
    ap.add_argument("tests", nargs="*")
    args = ap.parse_args()
    cls = import_suite(args.backend, args.world_size, args.tensors)
    names = args.tests or sorted(unittest.TestLoader().getTestCaseNames(cls))
    if args.skip_long:
        from suite_lists import read_long

        names = [n for n in names if n not in read_long(args.tensors)]
    names = select_shard(names, args.shard)
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
