"""Tests of the torch-free shared-memory collective engine (npudist/hccl/engine).

A C++ driver (driver.cpp, driver_faults.cpp) is compiled once with g++ -O2 -pthread and started as one
process per rank; every rank checks its own results against a locally computed reference and prints
PASS / FAIL. Fault tests also assert on the error text. After every run /dev/shm must hold nothing of the
communicator, whatever the exit.
"""
import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid

import pytest

# Every test may have to wait for the one-time driver build (about a minute on a busy 2-core machine);
# the rank processes themselves are bounded by run_ranks' own wall-clock limit.
pytestmark = pytest.mark.timeout(400)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ENGINE = os.path.join(ROOT, "npudist", "hccl", "engine")
VOCABULARY = os.path.join(ROOT, "npudist", "hccl", "csrc", "include")   # npudist/comm_types.h
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(glob.glob(os.path.join(ENGINE, "*.cpp"))) + [
    os.path.join(HERE, "driver.cpp"), os.path.join(HERE, "driver_faults.cpp")]
HEADERS = sorted(glob.glob(os.path.join(ENGINE, "*.h"))) + [os.path.join(HERE, "driver_common.h"),
                                                           os.path.join(VOCABULARY, "npudist", "comm_types.h")]


@pytest.fixture(scope="session")
def driver():
    """Builds the driver once per source version; a file lock shares the binary between xdist workers."""
    h = hashlib.sha1()
    for p in SOURCES + HEADERS:
        with open(p, "rb") as f:
            h.update(f.read())
    out_dir = os.path.join(tempfile.gettempdir(), "npudist_engine_test_" + h.hexdigest()[:12])
    os.makedirs(out_dir, exist_ok=True)
    binary = os.path.join(out_dir, "driver")
    with open(os.path.join(out_dir, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(binary):
            build(out_dir, binary)
    return binary


def build(out_dir, binary):
    """Compiles the sources two at a time (the machine has 2 cores), then links."""
    objs, pending = [], list(SOURCES)
    running = []
    while pending or running:
        while pending and len(running) < 2:
            src = pending.pop(0)
            obj = os.path.join(out_dir, os.path.basename(src) + ".%d.o" % os.getpid())
            objs.append(obj)
            cmd = ["g++", "-std=c++17", "-O2", "-pthread", "-Wall", "-I", ENGINE, "-I", VOCABULARY, "-c", src, "-o", obj]
            running.append((subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True), src))
        proc, src = running.pop(0)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, "compiling %s failed:\n%s" % (src, err[-4000:])
    tmp = binary + ".tmp%d" % os.getpid()
    res = subprocess.run(["g++", "-pthread", *objs, "-o", tmp, "-lrt"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, "driver link failed:\n" + res.stderr[-4000:]
    os.rename(tmp, binary)
    for o in objs:
        os.unlink(o)


def shm_leftovers(name):
    return [p for p in os.listdir("/dev/shm") if p.startswith("npudist_" + name)]


def run_ranks(driver, test, n, *, timeout_ms=20000, buffer=16 << 10, wall=90, env=None):
    """Starts n rank processes; returns [(returncode, output)] per rank. Always reaps every process."""
    env = dict(os.environ, **(env or {}))
    name = "enginetest_%s_%s" % (test, uuid.uuid4().hex[:10])
    boot = tempfile.mkdtemp(prefix="npudist_boot_")
    procs = []
    try:
        for r in range(n):
            cmd = [driver, "--rank", str(r), "--size", str(n), "--dir", boot, "--name", name, "--test", test,
                   "--buffer", str(buffer), "--timeout-ms", str(timeout_ms)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=wall)
            results.append((p.returncode, out))
        return results, name
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        shutil.rmtree(boot, ignore_errors=True)


def assert_all_pass(results, name, expect_rc=None):
    for r, (rc, out) in enumerate(results):
        want = (expect_rc or {}).get(r, 0)
        assert rc == want, "rank %d exited %s (expected %s):\n%s" % (r, rc, want, out)
        if want == 0:
            assert "PASS rank %d" % r in out, out
    assert shm_leftovers(name) == [], "shared memory left behind: %s" % shm_leftovers(name)


@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_dtype_and_reduce_op_matches_reference(driver, n):
    results, name = run_ranks(driver, "collectives", n)
    assert_all_pass(results, name)


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_with_default_sized_buffer(driver, n):
    # 1 MiB staging buffer: exercises the one-shot/pipelined switch at realistic chunk sizes.
    results, name = run_ranks(driver, "collectives", n, buffer=1 << 20)
    assert_all_pass(results, name)


@pytest.mark.parametrize("mode", [{"NPUDIST_ENGINE_DIRECT_KB": "1", "NPUDIST_ENGINE_DIRECT": "1"}, {"NPUDIST_ENGINE_DIRECT": "0"}],
                         ids=["direct-mode-everywhere", "staging-only"])
def test_collectives_in_direct_and_staging_modes(driver, mode):
    # Direct mode (peers read each other's buffers with process_vm_readv) for every size >= 1 KiB,
    # and the staging-copy algorithms alone, as used where cross-process reads are not permitted.
    results, name = run_ranks(driver, "collectives", 4, env=mode)
    assert_all_pass(results, name)


@pytest.mark.parametrize("direct", ["1", "0"])
def test_copy_path_is_logged_once_per_process(driver, direct):
    # With torch.distributed's debug logging on, every process states once which copy path its cpu-buffer
    # collectives take: cross-memory attach (single copy) or staging through shared memory (forced off).
    results, name = run_ranks(driver, "collectives", 2,
                              env={"TORCH_DISTRIBUTED_DEBUG": "INFO", "NPUDIST_ENGINE_DIRECT": direct})
    assert_all_pass(results, name)
    want = "copy once, peer to peer" if direct == "1" else "staged through shared memory (NPUDIST_ENGINE_DIRECT=0)"
    for _, out in results:
        assert out.count("npudist hccl: ") == 1 and want in out, out


def test_collectives_with_portable_kernels_and_streaming_stores(driver):
    # Baseline-ISA reduction kernels (no AVX2/F16C) and streaming stores for every output size.
    results, name = run_ranks(driver, "collectives", 2,
                              env={"NPUDIST_ENGINE_NO_AVX2": "1", "NPUDIST_ENGINE_STREAM_KB": "1"})
    assert_all_pass(results, name)


@pytest.mark.parametrize("n", [2, 4])
def test_point_to_point(driver, n):
    results, name = run_ranks(driver, "p2p", n)
    assert_all_pass(results, name)


@pytest.mark.parametrize("n", [2, 4])
def test_mismatched_calls_name_the_disagreeing_rank(driver, n):
    results, name = run_ranks(driver, "mismatch", n)
    assert_all_pass(results, name)
    out = results[0][1]
    assert "rank %d called all_reduce(seq=1, count=7" % (n - 1) in out
    assert "(differs in dtype)" in out and "(differs in root)" in out


def test_timeout_names_missing_rank(driver):
    results, name = run_ranks(driver, "timeout", 2, timeout_ms=1500)
    assert_all_pass(results, name)
    assert "ranks [1] did not arrive" in results[0][1]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("direct", ["1", "0"])  # forced on (any size) / off
def test_killed_peer_fails_fast_and_leaves_no_shm(driver, n, direct):
    results, name = run_ranks(driver, "kill", n, timeout_ms=30000, env={"NPUDIST_ENGINE_DIRECT": direct})
    assert_all_pass(results, name, expect_rc={n - 1: -9})
    for rc, out in results[:-1]:
        assert "rank %d (pid" % (n - 1) in out and "exited" in out


@pytest.mark.parametrize("n", [2, 3])
def test_abort_fails_pending_and_later_waits_on_every_rank(driver, n):
    results, name = run_ranks(driver, "abort", n)
    assert_all_pass(results, name)


def test_connect_timeout_when_a_rank_never_attaches(driver):
    results, name = run_ranks(driver, "connect_timeout", 2, timeout_ms=1000)
    assert_all_pass(results, name)
    assert "did not attach" in results[0][1]


def test_segment_left_by_a_crash_in_connect_is_removed_by_the_next_job(driver):
    # Rank 0 of a 2-rank job creates its segment and is killed while waiting for rank 1 to attach:
    # the only window in which a segment name exists. The next job's rank 0 removes it.
    name = "enginetest_stale_" + uuid.uuid4().hex[:10]
    boot = tempfile.mkdtemp(prefix="npudist_boot_")
    proc = subprocess.Popen([driver, "--rank", "0", "--size", "2", "--dir", boot, "--name", name, "--test", "p2p",
                             "--timeout-ms", "60000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while not shm_leftovers(name) and time.time() < deadline:
            time.sleep(0.05)
        assert shm_leftovers(name), "rank 0 never created its segment"
        time.sleep(1.0)  # let it finish initialising the header (it then waits for rank 1 to attach)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(boot, ignore_errors=True)
    # (Another test's rank 0 running in parallel may already have removed it: that is the feature.)
    results, other = run_ranks(driver, "mismatch", 2)
    assert_all_pass(results, other)
    assert shm_leftovers(name) == []
