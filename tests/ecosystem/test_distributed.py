"""2-rank jobs under npurun on npu + hccl: accelerate's Accelerator, and a CUDA script via transfer_to_npu."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
from launch_helpers import run_npurun, worker_lines  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"


def _reports(res):
    assert res.returncode == 0, res.output[-6000:]
    reports = {r: json.loads(v) for r, v in worker_lines(res, "REPORT").items()}
    assert sorted(reports) == [0, 1], res.output[-6000:]
    return reports


def test_accelerate_picks_npu_and_hccl_and_steps_like_one_process(tmp_path):
    pytest.importorskip("accelerate",
                        reason="accelerate is not installed (pinned in requirements-test.txt)")
    reports = _reports(run_npurun(["--nproc", "2", str(SCRIPTS / "accelerate_ddp.py")], tmp_path))
    for rank, rep in reports.items():
        assert rep["device"] == rep["param_device"] == f"npu:{rank}"
        assert rep["multi_npu"] and rep["backend"] == "hccl", rep
        assert rep["max_err"] < 1e-6, rep


def test_cuda_script_runs_unchanged_through_transfer_to_npu(tmp_path):
    reports = _reports(run_npurun(["--nproc", "2", str(SCRIPTS / "cuda_train.py")], tmp_path))
    for rank, rep in reports.items():
        assert rep["param_device"] == rep["x_device"] == f"npu:{rank}"
        assert rep["backend"] == "hccl" and rep["mem"] > 0, rep
        assert rep["max_err"] < 1e-6, rep


def test_npu_operators_on_dtensors_match_full_tensors(tmp_path):
    reports = _reports(run_npurun(["--nproc", "2", str(SCRIPTS / "dtensor_ops.py")], tmp_path))
    for rep in reports.values():
        assert rep["out_placements"] == "(Shard(dim=0),)", rep
        assert all(v < 1e-5 for v in rep["err"].values()), rep
