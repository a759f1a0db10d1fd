"""DDP on 2 npu ranks over hccl with BatchNorm and with SyncBatchNorm trains like single-process CPU
training (SyncBatchNorm runs the npu batch_norm_stats / gather / elemt / backward kernels)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hccl"))
from launcher import run_ranks  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "syncbn_worker.py")


@pytest.mark.parametrize("norm", ["bn", "syncbn"])
def test_ddp_batchnorm_on_npu(norm):
    run_ranks(norm, 2, worker=WORKER, timeout=150)
