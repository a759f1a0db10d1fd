"""torch_npu.distributed.reinit_process_group on hccl (scenarios: scen_reinit.py), 2 ranks, cpu and npu tensors:
collectives after a rebuild, a rebuild after a hung or timed-out collective, a rank that does not rebuild
(errors, never a hang), rebuild_link=False, the default group, gloo and mixed groups, bad arguments."""
import os

import pytest

from launcher import run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scen_reinit.py")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_collectives_after_reinit_equal_expected(device):
    run_ranks("reinit_then_collectives", 2, args=(device,), timeout=90, worker=WORKER)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_reinit_fails_a_hung_collective_and_keeps_the_process(device):
    # Default error handling (tear down on a failed op): the op that reinit aborted must not trigger it.
    run_ranks("reinit_after_hung_collective", 2, args=(device,), timeout=90, worker=WORKER,
              env={"TORCH_HCCL_ASYNC_ERROR_HANDLING": "1"})


@pytest.mark.timeout(120)
def test_reinit_after_a_timed_out_collective():
    run_ranks("reinit_after_timeout", 2, timeout=90, worker=WORKER, env={"TORCH_HCCL_ASYNC_ERROR_HANDLING": "2"})


@pytest.mark.timeout(120)
def test_rank_that_did_not_reinit_gets_errors_not_a_hang():
    run_ranks("reinit_on_one_rank_only", 2, timeout=90, worker=WORKER)


@pytest.mark.timeout(120)
def test_resume_default_group_gloo_mixed_and_bad_arguments():
    run_ranks("reinit_other_paths", 2, timeout=90, worker=WORKER)
