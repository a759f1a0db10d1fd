"""npu operators with DTensor rules run on a 2-rank npu mesh under npurun and match the full tensors: MoE
permute/unpermute on hidden-sharded tokens, norms and activations on batch-sharded activations, aten.matmul and
aten.matmul_backward with column-, row- and batch-sharded operands."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
from launch_helpers import run_npurun, worker_lines  # noqa: E402


def test_moe_norm_and_activation_ops_on_sharded_dtensors(tmp_path):
    res = run_npurun(["--nproc", "2", str(Path(__file__).parent / "_dtensor_worker.py")], tmp_path)
    assert res.returncode == 0, res.output[-6000:]
    reports = {r: json.loads(v) for r, v in worker_lines(res, "REPORT").items()}
    assert sorted(reports) == [0, 1], res.output[-6000:]
    for rep in reports.values():
        assert set(rep["placements"].values()) == {"(Shard(dim=1),)"}, rep
        assert all(v < 1e-5 for form in rep["err"].values() for v in form.values()), rep
    matmul = {r: json.loads(v) for r, v in worker_lines(res, "MATMUL").items()}
    assert sorted(matmul) == [0, 1], res.output[-6000:]
    for rep in matmul.values():
        assert rep["registered"] == ["aten.matmul.default", "aten.matmul_backward.default"], rep
        assert rep["column"]["placements"] == ["(Shard(dim=2),)", "(Partial(sum),)", "(Shard(dim=1),)"], rep
        assert rep["row"]["placements"] == ["(Partial(sum),)", "(Shard(dim=2),)", "(Shard(dim=0),)"], rep
        assert rep["batch"]["placements"] == ["(Shard(dim=0),)", "(Shard(dim=0),)", "(Partial(sum),)"], rep
        assert all(e < 1e-5 for form in ("column", "row", "batch") for e in rep[form]["err"]), rep
