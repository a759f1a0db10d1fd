"""npu tensors through hccl (collectives, async/futures, groups) and DDP training on npu."""
import pytest

from launcher import run_ranks

ENV = {"HCCL_BUFFSIZE": "1"}


def test_every_collective_npu():
    run_ranks("collectives", 2, env=ENV, args=("npu",), timeout=200)


def test_p2p_coalesced_objects_functional_async_npu():
    run_ranks("p2p_and_misc", 2, env=ENV, args=("npu",), timeout=150)


def test_npu_ops_ordered_after_current_stream_work():
    run_ranks("stream_order", 2, timeout=90)


def test_groups_split_mesh_options():
    run_ranks("groups", 4, timeout=200)


def test_mixed_cpu_gloo_npu_hccl():
    run_ranks("mixed_backends", 2, timeout=90)


def test_hccl_exec_timeout_env():
    run_ranks("exec_timeout_env", 2, env={"HCCL_EXEC_TIMEOUT": "23"}, timeout=90)


@pytest.mark.parametrize("hook", ["", "hook"])
def test_ddp_on_npu_matches_single_process(hook):
    run_ranks("ddp", 2, args=(hook,) if hook else (), timeout=150)


@pytest.mark.parametrize("world_size", [2, 4])
def test_zero_copy_collectives_npu(world_size):
    run_ranks("zero_copy", world_size, timeout=150)


def test_zero_copy_disabled_by_env():
    run_ranks("zero_copy", 2, env={"NPUDIST_ENGINE_ZERO_COPY": "0"}, timeout=150)
