"""Work futures with NCCL's semantics, PyTorch's DDP communication hooks, DDP join() with uneven inputs and
DDP's npu compute times, over hccl on npu and cpu tensors (scenarios in scen_comm_hooks.py)."""
import pytest

from launcher import run_ranks

HOOKS = ["allreduce", "fp16_compress", "bf16_compress", "fp16_wrapper_allreduce", "powerSGD",
         "powerSGD_fp16_wrapper", "post_localSGD", "optimizer_overlap"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("device", ["npu", "cpu"])
def test_future_semantics(device):
    run_ranks("future_semantics", 2, args=(device,), timeout=150)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("device", ["npu", "cpu"])
@pytest.mark.parametrize("hook", HOOKS)
def test_comm_hook_trains_like_no_hook(device, hook):
    run_ranks("comm_hook", 2, args=(device, hook), timeout=150)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", ["npu", "cpu"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_powersgd_world_size(device, world_size):
    run_ranks("comm_hook", world_size, args=(device, "powerSGD"), timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", ["npu", "cpu"])
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("hook", ["", "powerSGD"])
def test_join_uneven_inputs(device, world_size, hook):
    run_ranks("join_uneven", world_size, args=(device, hook) if hook else (device,), timeout=240)


@pytest.mark.timeout(200)
def test_ddp_logging_data_has_npu_compute_times():
    run_ranks("ddp_timer", 2, timeout=150)
