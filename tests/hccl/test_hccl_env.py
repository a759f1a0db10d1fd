"""HCCL's environment with CANN's meaning (docs/hccl.md, "Environment"): the communicator buffers of
HCCL_BUFFSIZE in device memory, EI0002 / EI0006 timeouts, HCCL_DETERMINISTIC, the heartbeat monitor, and
their place in `npudist plan check`. Distributed runs use 2 ranks, except the determinism test (with two
inputs a sum is the same in either order, so it needs three)."""
from __future__ import annotations

import re
import time

import pytest

from launcher import run_ranks

pytestmark = pytest.mark.timeout(180)


def test_communicator_buffers_are_charged_to_device_memory():
    run_ranks("comm_buffers", 2, timeout=150, env={"HCCL_BUFFSIZE": "200"})


def test_exec_timeouts_carry_ei0002_and_the_legacy_error_handling_name_works():
    results = run_ranks("exec_timeouts", 2, timeout=90,
                        env={"HCCL_EXEC_TIMEOUT": "3", "TORCH_HCCL_ASYNC_ERROR_HANDLING": "",
                             "HCCL_ASYNC_ERROR_HANDLING": "2"})
    assert "HCCL_ASYNC_ERROR_HANDLING is deprecated" in results[0].output, results[0].output[-3000:]


def _digest(results):
    digests = {m for r in results for m in re.findall(r"DIGEST (\w+)", r.output)}
    assert len(digests) == 1, digests
    return digests.pop()


def test_deterministic_levels_reduce_in_one_order_bitwise():
    strict = _digest(run_ranks("deterministic_sum", 3, timeout=150, env={"HCCL_DETERMINISTIC": "strict"}))
    true = _digest(run_ranks("deterministic_sum", 3, timeout=150, env={"HCCL_DETERMINISTIC": "TRUE"}))
    assert strict == true


def test_heartbeat_monitor_ends_a_process_whose_watchdog_is_stuck():
    t0 = time.monotonic()
    results = run_ranks("stuck_watchdog", 2, timeout=90, expect_ok=False,
                        env={"TORCH_HCCL_ENABLE_MONITORING": "1", "TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC": "2",
                             "TORCH_HCCL_DUMP_ON_TIMEOUT": "1"})
    for r in results:
        assert r.returncode == 1, r.output[-3000:]
        assert "hccl heartbeat monitor" in r.output and "TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC=2" in r.output, \
            r.output[-3000:]
        assert "did not end the process" not in r.output
    assert time.monotonic() - t0 < 60


def test_plan_check_counts_the_communicator_buffers(monkeypatch):
    from npudist.plan.check import capacity_warnings, check_plan
    from npudist.plan.estimate import estimate_all
    from npudist.plan.loader import load_plan

    from launcher import REPO

    path = f"{REPO}/examples/plans/fsdp_tp.yaml"
    monkeypatch.setenv("HCCL_BUFFSIZE", "200")
    plan = load_plan(path, world_size=4)
    degrees = plan.parallel.degrees()
    est = estimate_all(plan, degrees)
    # world + the dp_shard and tp groups of a 2 x 2 mesh: 3 communicators of 2 x 200 MB on every rank
    assert all(e.communicators == ["world", "dp_shard", "tp"] for e in est)
    assert all(e.comm_buffer_bytes == 3 * 400 << 20 for e in est)
    _, _, text = check_plan(path, 4)
    assert "hccl      3 communicators per rank (world, dp_shard, tp) x 2 x HCCL_BUFFSIZE=200 MB = 1.17 GiB" in text
    tensors = max(e.device_bytes - e.comm_buffer_bytes for e in est)
    # A device that holds the tensors but not the buffers: plan check says so, naming HCCL_BUFFSIZE.
    capacity = tensors + (1 << 30)
    warnings = capacity_warnings(plan, degrees, capacity=capacity)
    assert len(warnings) == 1 and "1.17 GiB of it the buffers of 3 hccl communicators" in warnings[0], warnings
    monkeypatch.setenv("HCCL_BUFFSIZE", "100")
    assert capacity_warnings(plan, degrees, capacity=capacity) == []
    cpu = load_plan(path, ["--training.device", "cpu", "--training.backend", "gloo"], world_size=4)
    assert all(e.comm_buffer_bytes == 0 for e in estimate_all(cpu, cpu.parallel.degrees()))
