"""Runs a scenario of tests/hccl/worker.py on N local ranks (subprocesses, FileStore rendezvous).

Every run is bounded by a timeout, kills its whole process group on expiry, and checks that no
shared-memory segment of the engine is left in /dev/shm.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


@dataclass
class RankResult:
    rank: int
    returncode: int
    output: str


def shm_segments(job_id: str) -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("npudist_") and job_id in n}
    except FileNotFoundError:
        return set()


def run_ranks(scenario: str, world_size: int, *, timeout: float = 120.0, env: dict | None = None,
              rank_env: dict[int, dict] | None = None, args: tuple = (), expect_ok: bool = True,
              check_shm: bool = True, worker: str = WORKER) -> list[RankResult]:
    """Start `world_size` workers running `scenario` of `worker` (tests/hccl/worker.py by default);
    return their results once all exited."""
    job_id = "t" + uuid.uuid4().hex[:12]
    tmpdir = tempfile.mkdtemp(prefix="hccl_test_")
    store_path = os.path.join(tmpdir, "store")
    procs = []
    outs = []
    for rank in range(world_size):
        e = dict(os.environ)
        e.update({
            "PYTHONPATH": REPO + os.pathsep + e.get("PYTHONPATH", ""),
            "RANK": str(rank), "WORLD_SIZE": str(world_size), "HCCL_TEST_STORE": store_path,
            "HCCL_TEST_TMP": tmpdir, "OMP_NUM_THREADS": "1",
            # Tests catch DistBackendError in Python unless they ask for teardown.
            "TORCH_HCCL_ASYNC_ERROR_HANDLING": "0",
            "NPUDIST_JOB_ID": job_id,
            # A rank that dies of a signal (an abort at exit among them) prints every Python thread's stack.
            "PYTHONFAULTHANDLER": "1",
        })
        e.update(env or {})
        e.update((rank_env or {}).get(rank, {}))
        out = tempfile.TemporaryFile(mode="w+")
        outs.append(out)
        procs.append(subprocess.Popen([sys.executable, worker, scenario, *map(str, args)], env=e,
                                      stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                      start_new_session=True))
    deadline = time.monotonic() + timeout
    timed_out = False
    for p in procs:
        remaining = deadline - time.monotonic()
        try:
            p.wait(timeout=max(remaining, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait(timeout=30)
    shutil.rmtree(tmpdir, ignore_errors=True)
    results = []
    for rank, (p, out) in enumerate(zip(procs, outs)):
        out.seek(0)
        results.append(RankResult(rank, p.returncode, out.read()))
        out.close()
    report = "\n".join(f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.output[-6000:]}" for r in results)
    if timed_out:
        raise AssertionError(f"scenario {scenario} timed out after {timeout}s\n{report}")
    if expect_ok:
        bad = [r for r in results if r.returncode != 0 or "SCENARIO OK" not in r.output]
        assert not bad, f"scenario {scenario} failed\n{report}"
    if check_shm:
        # Segments are unlinked at teardown; give a killed job's survivors a moment to finish.
        for _ in range(50):
            leaked = shm_segments(job_id)
            if not leaked:
                break
            time.sleep(0.1)
        assert not leaked, f"scenario {scenario} left shared memory behind: {sorted(leaked)}\n{report}"
    return results
