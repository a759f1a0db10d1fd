"""The newer c10d Backend capabilities on hccl, through PyTorch's own API (scenarios in scen_capabilities.py):
coalescing, shrink_group, tensors allocated by the group for FSDP2's communication buffers."""
import pytest

from launcher import run_ranks


@pytest.mark.timeout(200)
@pytest.mark.parametrize("device", ["npu", "cpu"])
def test_coalescing_manager_and_batched_p2p(device):
    run_ranks("coalescing", 2, args=(device,), timeout=150)


@pytest.mark.timeout(250)
@pytest.mark.parametrize("device", ["npu", "cpu"])
def test_shrink_group_with_abort_and_of_the_default_group(device):
    run_ranks("shrink", 4, args=(device,), timeout=200)


@pytest.mark.timeout(200)
def test_fsdp2_buffers_allocated_by_the_group():
    run_ranks("alloc_for_comm", 2, timeout=150)
