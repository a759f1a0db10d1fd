"""npugraph_ex on 2 ranks with hccl: collectives inside the compiled graph run between captured pieces."""
import os
import sys

import pytest

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("compile_dist")]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training"))
from _train_spawn import run_ranks  # noqa: E402

from ._npugraph_ex_dist_worker import collectives_worker, tp_block_worker  # noqa: E402


def test_tp_block_trains_like_eager(tmp_path):
    run_ranks(tp_block_worker, 2, (), str(tmp_path), timeout=500)


def test_functional_collectives_replay_like_eager(tmp_path):
    run_ranks(collectives_worker, 2, (), str(tmp_path), timeout=300)
