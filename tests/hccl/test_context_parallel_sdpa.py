"""PyTorch's own DTensor parallelism around npu attention, 2 ranks over hccl (scenarios: scen_cp_sdpa.py):
``context_parallel()`` (ring attention over the npu flash operator) and ``parallelize_module`` tensor
parallelism of attention + MLP, each against one device."""
import os

import pytest

from launcher import run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scen_cp_sdpa.py")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mask", ["causal", "full"])
def test_torch_context_parallel_matches_one_device(mask):
    run_ranks("context_parallel_attention", 2, args=(mask,), timeout=240, worker=WORKER)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sp", ["sp", "no_sp"])
def test_tensor_parallel_transformer_trains_as_one_device(sp):
    run_ranks("tensor_parallel_transformer", 2, args=(sp,), timeout=240, worker=WORKER)
