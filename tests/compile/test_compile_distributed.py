"""Compiled FSDP2 x2 and TP x2 on npu + hccl match eager single-process training (2 steps)."""
import os
import sys

import pytest

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("compile_dist")]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training"))
from _train_spawn import run_ranks  # noqa: E402  (the rank launcher the training tests use)

from ._dist_worker import compiled_parallel_worker  # noqa: E402


@pytest.mark.parametrize("layout", ["fsdp", "tp"])
def test_compiled_parallel_matches_eager(layout, tmp_path):
    run_ranks(compiled_parallel_worker, 2, (layout,), str(tmp_path), timeout=500)
