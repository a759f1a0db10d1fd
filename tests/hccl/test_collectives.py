"""Every collective of torch.distributed on the hccl backend at 2 and 4 ranks, against local references.

Each test starts one multi-process run that performs hundreds of checks (see worker.py); HCCL_BUFFSIZE=1
makes the "large" sizes exceed the shared-memory buffer so the chunked paths run.
"""
import pytest

from launcher import run_ranks

ENV = {"HCCL_BUFFSIZE": "1"}


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_collective_cpu(world_size):
    run_ranks("collectives", world_size, env=ENV, timeout=200)


@pytest.mark.parametrize("world_size", [2, 4])
def test_p2p_coalesced_objects_functional_async_cpu(world_size):
    run_ranks("p2p_and_misc", world_size, env=ENV, timeout=150)


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_async_wait_out_of_order(device):
    run_ranks("async_wait_out_of_order", 2, args=(device,), timeout=90)


@pytest.mark.parametrize("blocking_wait", ["0", "1"])
def test_npu_wait_orders_the_current_stream(blocking_wait):
    # The failed-collective case must reach Python, not the watchdog's teardown.
    run_ranks("npu_wait_on_stream", 2, timeout=90,
              env={"TORCH_HCCL_BLOCKING_WAIT": blocking_wait, "TORCH_HCCL_ASYNC_ERROR_HANDLING": "0"})


@pytest.mark.parametrize("world_size", [2, 3])
def test_gloo_extras_cpu_npu(world_size):
    # all_gather_coalesced, recv from any source, sparse all_reduce, monitored barrier (scen_extras.py)
    run_ranks("extras", world_size, timeout=150)
