"""Runs a scenario of tests/hccl/worker.py on N local ranks (subprocesses, FileStore rendezvous).

Every run is bounded by a timeout, kills its whole process group on expiry, and checks that no
shared-memory segment of the engine is left in /dev/shm. Ranks are forked from a process that imported torch
already (tests/hccl/zygote.py) when their environment allows it, otherwise started as fresh interpreters;
HCCL_TEST_FRESH_INTERPRETERS=1 starts every rank fresh.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
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


ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")
# What a rank's environment may set differently from the zygote's and still be forked from it: variables that
# torch's import does not read (npudist, hccl and the tests read theirs after the fork).
_FORKABLE_PREFIXES = ("NPUDIST_", "HCCL_", "TORCH_HCCL_", "ASCEND_", "PYTEST_")
_FORKABLE_KEYS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "PYTHONFAULTHANDLER", "TORCH_DEVICE_BACKEND_AUTOLOAD",
                  "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"}


class _Zygote:
    """This test process's zygote (started at first use, ends when this process does)."""

    _lock = threading.Lock()
    _proc: subprocess.Popen | None = None
    _env: dict = {}
    _next_id = 0

    @classmethod
    def _started(cls) -> subprocess.Popen:
        if cls._proc is not None and cls._proc.poll() is None:
            return cls._proc
        env = dict(os.environ)
        env.update({"PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
                    "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
        cls._env = env
        cls._proc = subprocess.Popen([sys.executable, ZYGOTE], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=REPO)
        return cls._proc

    @classmethod
    def forkable(cls, env: dict) -> bool:
        if os.environ.get("HCCL_TEST_FRESH_INTERPRETERS") == "1":
            return False
        with cls._lock:
            cls._started()
            base = cls._env
        for k in set(env) | set(base):
            if env.get(k) != base.get(k) and k not in _FORKABLE_KEYS and not k.startswith(_FORKABLE_PREFIXES):
                return False
        return True

    @classmethod
    def call(cls, req: dict) -> dict:
        with cls._lock:
            p = cls._started()
            cls._next_id += 1
            req = dict(req, id=cls._next_id)
            p.stdin.write(json.dumps(req) + "\n")
            p.stdin.flush()
            while True:
                line = p.stdout.readline()
                if not line:
                    raise RuntimeError(f"tests/hccl/zygote.py exited (code {p.poll()}) during {req['op']}")
                reply = json.loads(line)
                # A test interrupted while waiting (pytest-timeout) left that request's reply unread: skip it.
                if reply.get("id") == req["id"]:
                    return reply


class _ForkedRank:
    """The Popen calls run_ranks makes, for a rank forked by the zygote."""

    def __init__(self, argv: list, env: dict, out_path: str):
        self.pid = _Zygote.call({"op": "spawn", "argv": argv, "env": env, "cwd": REPO, "out": out_path})["pid"]
        self.returncode = None

    def poll(self):
        return self.wait(0.0, raise_on_timeout=False)

    def wait(self, timeout: float, raise_on_timeout: bool = True):
        if self.returncode is None:
            self.returncode = _Zygote.call({"op": "wait", "pid": self.pid, "timeout": timeout})["code"]
        if self.returncode is None and raise_on_timeout:
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
        return self.returncode


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
        argv = [worker, scenario, *map(str, args)]
        out = os.path.join(tmpdir, f"rank{rank}.out")
        outs.append(out)
        if _Zygote.forkable(e):
            procs.append(_ForkedRank(argv, e, out))
            continue
        with open(out, "w") as f:
            procs.append(subprocess.Popen([sys.executable, *argv], env=e, stdout=f, stderr=subprocess.STDOUT,
                                          cwd=REPO, start_new_session=True))
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
    results = []
    for rank, (p, out) in enumerate(zip(procs, outs)):
        with open(out, errors="backslashreplace") as f:
            results.append(RankResult(rank, p.returncode, f.read()))
    shutil.rmtree(tmpdir, ignore_errors=True)
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
