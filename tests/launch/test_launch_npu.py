"""npurun on npu devices with the hccl backend: binding, device checks, single- and multi-node jobs."""
from __future__ import annotations

import json

import pytest
from launch_helpers import SCRIPTS, free_port, run_npurun, run_two_nodes, worker_lines

REPORT = str(SCRIPTS / "report_npu.py")


def _reports(result):
    return {r: json.loads(v) for r, v in worker_lines(result, "REPORT").items()}


@pytest.mark.parametrize("nproc", [2, 4])
def test_single_node_binds_devices_and_all_reduces(tmp_path, nproc):
    res = run_npurun(["--nproc", str(nproc), "--hccl-buffsize", "4", REPORT], tmp_path)
    assert res.returncode == 0, res.output
    reports = _reports(res)
    assert sorted(reports) == list(range(nproc))
    total = nproc * (nproc + 1) / 2
    for rank, rep in reports.items():
        assert (rep["rank"], rep["world"], rep["local_rank"], rep["bound"]) == (rank, nproc, rank, rank)
        assert rep["tensor_device"] == f"npu:{rank}" and rep["backend"] == "hccl"
        assert rep["sum_min"] == rep["sum_max"] == total
        assert (rep["num_nodes"], rep["uses_gloo"], rep["buffer_mb"]) == (1, False, 4)
    start = res.summary_lines()[0]
    assert f"ranks 0-{nproc - 1} of {nproc}, devices npu:0-{nproc - 1} of " in start, start


def test_auto_follows_visible_devices(tmp_path):
    res = run_npurun(["--nproc", "auto", REPORT], tmp_path, env={"ASCEND_RT_VISIBLE_DEVICES": "5,6"})
    assert res.returncode == 0, res.output
    reports = _reports(res)
    assert sorted(reports) == [0, 1]
    assert [(reports[r]["bound"], reports[r]["device_count"], reports[r]["sum_min"]) for r in (0, 1)] == [
        (0, 2, 3.0), (1, 2, 3.0)]
    assert "devices npu:0-1 of 2 visible" in res.summary_lines()[0]


def test_more_ranks_than_devices_fails_before_start(tmp_path):
    res = run_npurun(["--nproc", "3", REPORT], tmp_path, env={"ASCEND_RT_VISIBLE_DEVICES": "0,1"}, timeout=60)
    assert res.returncode == 2, res.output
    assert ("--nproc-per-node 3 asks for 3 ranks per node but only 2 npu device(s) are visible "
            "(ASCEND_RT_VISIBLE_DEVICES=0,1)") in res.stderr
    assert "start attempt" not in res.output and "[rank" not in res.output  # nothing was launched


def test_two_simulated_nodes_take_internode_path(tmp_path):
    port = free_port()
    common = ["--nnodes", "2", "--nproc", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--hccl-timeout", "60", REPORT]
    results = run_two_nodes(common, tmp_path)
    for n, res in enumerate(results):
        assert res.returncode == 0, res.output
        reports = _reports(res)
        assert sorted(reports) == [2 * n, 2 * n + 1]
        for rank, rep in reports.items():
            assert (rep["world"], rep["local_rank"], rep["bound"], rep["node_id"]) == (4, rank - 2 * n, rank - 2 * n, f"sim{n}")
            assert rep["sum_min"] == rep["sum_max"] == 10.0
            # the hccl group spans two nodes: the exchange between them goes over the inter-node path
            assert (rep["num_nodes"], rep["node_index"], rep["uses_gloo"]) == (2, n, True)
        assert "HCCL_EXEC_TIMEOUT=60" in res.summary_lines()[0]


def test_crash_on_one_node_fails_both_nodes(tmp_path):
    port = free_port()
    common = ["--nnodes", "2", "--nproc", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--hccl-timeout", "30", str(SCRIPTS / "crash_after_collective.py")]
    node0, node1 = run_two_nodes(common, tmp_path)
    assert node0.returncode == 1 and node1.returncode == 1, node0.output + node1.output
    assert "UNEXPECTED" not in node0.stdout + node1.stdout
    failed1 = [ln for ln in node1.summary_lines() if "FAILED" in ln][0]
    assert "rank 3 (local 1) exit code 1" in failed1
    assert any(ln.endswith("rank 3: RuntimeError: rank 3 dies after the first all_reduce")
               for ln in node1.summary_lines()), node1.output
    failed0 = [ln for ln in node0.summary_lines() if "FAILED" in ln][0]
    assert "node 0 ('sim0'), ranks 0-1 of 4" in failed0 and "rank 0 (local 0)" in failed0, node0.output
