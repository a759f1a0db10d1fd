"""The quantised MC2 operators (npu_all_gather_quant_mm, npu_quant_mm_reduce_scatter) on 2 ranks over hccl: int8
per-token / per-channel, float8 per-tensor and unscaled float16 / bfloat16 against the pages' formulas computed
from all ranks' inputs, the refused arguments, and torch.compile through the fake kernels."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from _train_spawn import run_ranks  # noqa: E402

from ._mc2_quant_worker import run  # noqa: E402


@pytest.mark.timeout(300)
def test_quant_mc2_operators_on_two_ranks(tmp_path):
    out = str(tmp_path / "mc2q")
    run_ranks(run, 2, (out,), str(tmp_path), timeout=240)
    for rank in (0, 1):
        results = torch.load(f"{out}.{rank}")
        assert "worker" not in results, results["worker"][2]
        failed = {k: v for k, v in results.items() if not v[0]}
        assert not failed, f"rank {rank}: {failed}"
        # every case ran: 6 all-gather results, 3 reduce-scatter results, 3 refusals, the compiled form
        assert len(results) == 6 + 3 + 3 + 1, sorted(results)
