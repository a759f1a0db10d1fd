"""The MC2 operators (npu_all_gather_base_mm, npu_mm_reduce_scatter_base, npu_mm_all_reduce_base) on 2 ranks
over hccl: every documented variant against the collective + matmul computed from all ranks' inputs, the
refused arguments (a ValueError naming the operator), no backward (as torch_npu), profiler names, and
torch.compile (fullgraph) through the fake kernels."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from _train_spawn import run_ranks  # noqa: E402

from ._mc2_worker import run  # noqa: E402


@pytest.mark.timeout(400)
def test_mc2_operators_on_two_ranks(tmp_path):
    out = str(tmp_path / "mc2")
    run_ranks(run, 2, (out,), str(tmp_path), timeout=360)
    for rank in (0, 1):
        results = torch.load(f"{out}.{rank}")
        assert "worker" not in results, results["worker"][2]
        failed = {k: v for k, v in results.items() if not v[0]}
        assert not failed, f"rank {rank}: {failed}"
        # every case ran: 4 + 1 gather variants (two results each), 3 + 3 x 2 matmul-collective variants,
        # 19 refused calls, no-backward, 3 profiler names, 2 compiled forms, the subgroup
        assert len(results) == 9 + 1 + 3 + 6 + 19 + 1 + 3 + 2 + 1, sorted(results)
