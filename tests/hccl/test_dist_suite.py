"""PyTorch's own DistributedTest suite (from the installed wheel) on the hccl backend, in two halves
(dist_suite/runner.py): cpu tensors under Gloo's skip rules, and npu tensors under NCCL's (the
device-path tests, the suite's CUDA calls routed to the npu).

cpu half: world sizes 2 and 4 (NPUDIST_DIST_SUITE_WORLD_SIZES=2 keeps only 2). A shard fails when a
test off dist_suite/expected_failures.txt fails, when a listed test passes or is skipped (the list is
stale), or when a test Gloo passes (dist_suite/gloo_passes_ws<N>.txt) is skipped on hccl.
npu half: world sizes NPU_WORLD_SIZES, without the tests of dist_suite/npu_long.txt. A shard fails when a
test off dist_suite/expected_failures_npu.txt fails, when a listed test does not fail, and when the
tests that pass differ from dist_suite/npu_passes_ws<N>.txt in either direction.
Counts, wall times and the long run's command are in docs/hccl.md.
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
from suite_lists import (  # noqa: E402
    compare, read_expected_failures, read_long, read_passes, read_reasoned, read_results, EXPECTED_FAILURES)

RUNNER = os.path.join(HERE, "dist_suite", "runner.py")
SHARDS = {"cpu": 4, "npu": 2}
PER_TEST_TIMEOUT = 60  # s, the suite's own join timeout for each test's ranks
SHARD_TIMEOUT = 540
WORLD_SIZES = [int(w) for w in os.environ.get("NPUDIST_DIST_SUITE_WORLD_SIZES", "2,4").split(",") if w.strip()]
# The npu half at 4 ranks is the documented long run's (docs/hccl.md): CI's budget holds world size 2.
NPU_WORLD_SIZES = [w for w in WORLD_SIZES if w == 2]


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
    known = suite_test_names()
    xfail = read_expected_failures("cpu", world_size)
    gloo = read_passes("cpu", world_size)
    assert gloo, f"gloo_passes_ws{world_size}.txt is empty"
    not_gloo = sorted(set(xfail) - gloo)
    assert not not_gloo, f"expected_failures.txt lists tests Gloo does not pass at world size {world_size}: {not_gloo}"
    npu_xfail = read_expected_failures("npu", world_size)
    npu_passes = read_passes("npu", world_size)
    assert npu_passes, f"npu_passes_ws{world_size}.txt is empty"
    both = sorted(set(npu_xfail) & npu_passes)
    assert not both, f"tests both on npu_passes_ws{world_size}.txt and expected to fail: {both}"
    for what, names in [(f"gloo_passes_ws{world_size}.txt", gloo), (f"npu_passes_ws{world_size}.txt", npu_passes),
                        ("expected_failures_npu.txt", set(read_reasoned(EXPECTED_FAILURES["npu"], world_size))),
                        ("npu_long.txt", set(read_long("npu")))]:
        unknown = sorted(names - known)
        assert not unknown, f"{what} names tests the installed DistributedTest lacks: {unknown}"


def run_shard(tensors: str, world_size: int, shard: int):
    shards = SHARDS[tensors]
    xfail = read_expected_failures(tensors, world_size)
    passes = read_passes(tensors, world_size)
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
        cmd = [sys.executable, RUNNER, "--backend", "hccl", "--tensors", tensors, "--world-size", str(world_size),
               "--shard", f"{shard}/{shards}", "--skip-long", "--out", out]
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
    problems = compare(results, names, passes, xfail, passes_exact=tensors == "npu")
    counts = {k: sum(r["outcome"] == k for r in results.values()) for k in ("passed", "failed", "skipped")}
    print(f"{tensors} tensors, world size {world_size}, shard {shard}/{shards}: {len(names)} tests, {counts}")
    assert proc.returncode == 0, f"runner exited with {proc.returncode}\n{stderr[-4000:]}"
    assert not problems, "\n\n".join(problems)
    assert not shm_segments(job_id), f"shared memory left behind: {sorted(shm_segments(job_id))}"


@pytest.mark.timeout(SHARD_TIMEOUT + 60)
@pytest.mark.parametrize("tensors,world_size,shard", [
    pytest.param(tensors, ws, i, marks=pytest.mark.xdist_group(f"dist_suite_{i % 2}"), id=f"{tensors}-ws{ws}-{i}")
    for tensors, sizes in (("cpu", WORLD_SIZES), ("npu", NPU_WORLD_SIZES))
    for ws in sizes for i in range(SHARDS[tensors])])
def test_distributed_suite_shard(tensors, world_size, shard):
    run_shard(tensors, world_size, shard)


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
    # The npu half pins its passes both ways: a test that starts passing makes the list stale too.
    newly = {"test_g": {"outcome": "passed", "detail": ""}}
    assert compare(newly, ["test_g"], gloo, xfail) == []
    assert [p.split(":")[0] for p in compare(newly, ["test_g"], gloo, xfail, passes_exact=True)] == ["test_g"]


def test_world_size_qualified_expected_failures(tmp_path):
    p = tmp_path / "xfail.txt"
    p.write_text("# header\ntest_a  # everywhere\ntest_b  [ws=4]  # only at 4 ranks\ntest_c [ws=2,3] # at 2 and 3\n")
    assert read_reasoned(str(p), 2) == {"test_a": "everywhere", "test_c": "at 2 and 3"}
    assert read_reasoned(str(p), 4) == {"test_a": "everywhere", "test_b": "only at 4 ranks"}
    p.write_text("test_a\n")
    with pytest.raises(ValueError, match="expected '<test name>"):
        read_reasoned(str(p), 2)
    p.write_text("test_a  # one\ntest_a  # two\n")
    with pytest.raises(ValueError, match="listed twice"):
        read_reasoned(str(p), 2)
