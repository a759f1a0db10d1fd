"""A profiled 2-rank FSDP step on npu + hccl: kernels with device time, sized collectives on the comm
stream track, npu memory events (the checks run in each rank: tests/profiler/fsdp_worker.py)."""
import os

import pytest

from launcher import run_ranks

pytestmark = pytest.mark.timeout(240)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_worker.py")


def test_profiled_fsdp_step_two_ranks():
    run_ranks("fsdp", 2, worker=WORKER, timeout=180)
