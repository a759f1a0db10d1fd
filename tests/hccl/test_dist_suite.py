"""PyTorch's own DistributedTest suite (from the installed wheel) on the hccl backend.

World sizes 2 and 4 (NPUDIST_DIST_SUITE_WORLD_SIZES=2 keeps only 2; the 4-rank shards add about 75 s of
wall time at -n 2).
The suite runs with Gloo's skip rules (dist_suite/runner.py), in SHARDS shards so pytest-xdist can
spread it. A shard fails when a test off dist_suite/expected_failures.txt fails, when a listed test
passes or is skipped (the list is stale), or when a test Gloo passes (dist_suite/gloo_passes_ws<N>.txt)
is skipped on hccl. Counts are in docs/hccl.md.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "dist_suite"))

from launcher import REPO, shm_segments  # noqa: E402
from suite_lists import compare, read_expected_failures, read_gloo_passes, read_results  # noqa: E402

RUNNER = os.path.join(HERE, "dist_suite", "runner.py")
SHARDS = 4
PER_TEST_TIMEOUT = 60  # s, the suite's own join timeout for each test's ranks
SHARD_TIMEOUT = 540
WORLD_SIZES = [int(w) for w in os.environ.get("NPUDIST_DIST_SUITE_WORLD_SIZES", "2,4").split(",") if w.strip()]


def suite_test_names() -> set[str]:
    """Test method names of PyTorch's DistributedTest, read from the wheel's source (importing it needs
    the suite's environment)."""
    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    assert spec and spec.origin, "torch's distributed_test.py is missing from the installed wheel"
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


@pytest.mark.parametrize("world_size", [2, 4])
def test_lists_are_consistent(world_size):
    xfail = read_expected_failures()
    gloo = read_gloo_passes(world_size)
    assert gloo, f"gloo_passes_ws{world_size}.txt is empty"
    not_gloo = sorted(set(xfail) - gloo)
    assert not not_gloo, f"expected_failures.txt lists tests Gloo does not pass at world size {world_size}: {not_gloo}"
    unknown = sorted(gloo - suite_test_names())
    assert not unknown, f"gloo_passes_ws{world_size}.txt names tests the installed DistributedTest lacks: {unknown}"


@pytest.mark.timeout(SHARD_TIMEOUT + 60)
@pytest.mark.parametrize("world_size,shard", [
    pytest.param(ws, i, marks=pytest.mark.xdist_group(f"dist_suite_{i % 2}"), id=f"ws{ws}-{i}")
    for ws in WORLD_SIZES for i in range(SHARDS)])
def test_distributed_suite_shard(world_size, shard):
    xfail = read_expected_failures()
    gloo = read_gloo_passes(world_size)
    job_id = "s" + uuid.uuid4().hex[:12]
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", ""),
        "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(PER_TEST_TIMEOUT),
        "NPUDIST_JOB_ID": job_id,
        "OMP_NUM_THREADS": "1",
    })
    with tempfile.TemporaryDirectory(prefix="dist_suite_") as tmp:
        out = os.path.join(tmp, "results.jsonl")
        # The suite leaves a rendezvous file per test in the temp dir: keep them in ours, removed below.
        env["TEMP_DIR"] = env["TMPDIR"] = tmp
        cmd = [sys.executable, RUNNER, "--backend", "hccl", "--world-size", str(world_size), "--shard", f"{shard}/{SHARDS}",
               "--out", out]
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=SHARD_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the runner and the ranks it forked
            _, stderr = proc.communicate()
            pytest.fail(f"shard {shard} did not finish within {SHARD_TIMEOUT} s\n{stderr[-4000:]}")
        names, results = read_results(out) if os.path.exists(out) else ([], {})
    assert names, f"the runner selected no tests (exit {proc.returncode})\n{stderr[-4000:]}"
    problems = compare(results, names, gloo, xfail)
    counts = {k: sum(r["outcome"] == k for r in results.values()) for k in ("passed", "failed", "skipped")}
    print(f"world size {world_size}, shard {shard}/{SHARDS}: {len(names)} tests, {counts}")
    assert proc.returncode == 0, f"runner exited with {proc.returncode}\n{stderr[-4000:]}"
    assert not problems, "\n\n".join(problems)
    assert not shm_segments(job_id), f"shared memory left behind: {sorted(shm_segments(job_id))}"


def test_compare_reports_each_kind_of_mismatch():
    gloo = {"test_a", "test_b", "test_c", "test_d"}
    xfail = {"test_b": "reason", "test_c": "reason"}
    results = {
        "test_a": {"outcome": "failed", "detail": "boom"},      # unexpected failure
        "test_b": {"outcome": "passed", "detail": ""},          # listed but passes: stale
        "test_c": {"outcome": "failed", "detail": "expected"},  # listed and fails: fine
        "test_d": {"outcome": "skipped", "detail": "why"},      # Gloo passes it, hccl skipped it
        "test_e": {"outcome": "skipped", "detail": "cuda"},     # Gloo skips it too: fine
    }
    problems = compare(results, ["test_a", "test_b", "test_c", "test_d", "test_e", "test_f"], gloo, xfail)
    assert [p.split(":")[0] for p in problems] == ["test_a", "test_b", "test_d", "test_f"], problems
    assert "remove it from the list" in problems[1] and "no result" in problems[3]
    assert compare({"test_c": results["test_c"]}, ["test_c"], gloo, xfail) == []
