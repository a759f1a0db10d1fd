"""Helpers for npurun tests: run the launcher as a subprocess with a hard timeout."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
LAUNCH_TIMEOUT = 200  # seconds for one npurun job (<= 4 workers); below pytest's 240 s per test


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def summary_lines(self) -> list[str]:
        return [ln for ln in self.output.splitlines() if ln.startswith("npurun:")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(cwd: Path, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env["TMPDIR"] = str(cwd)  # torchelastic's default log dirs (kept after failures) land in the test's dir
    # Keep the jobs small and independent of the caller's setup.
    for var in ("NPUDIST_NODE_ID", "NPUDIST_JOB_ID", "ASCEND_RT_VISIBLE_DEVICES", "HCCL_EXEC_TIMEOUT", "HCCL_BUFFSIZE",
                "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"):
        env.pop(var, None)
    env.update(extra or {})
    return env


def start_npurun(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "npudist.launch", *args], cwd=cwd, env=_env(cwd, env), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def collect_lines(stream) -> tuple[list[str], threading.Thread]:
    """Read a pipe line by line on a thread (so a test can react to output while the job runs)."""
    lines: list[str] = []

    def pump():
        for line in stream:
            lines.append(line)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return lines, t


def finish(proc: subprocess.Popen, timeout: float = LAUNCH_TIMEOUT, stdout_lines: list[str] | None = None,
           stderr_lines: list[str] | None = None) -> Result:
    """Wait for npurun (killing its whole session on timeout) and collect its output (``*_lines``: a stream
    that collect_lines consumed)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's session: agent + workers
        out, err = proc.communicate()
        pytest.fail(f"npurun timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    if stdout_lines is not None:  # stdout was consumed by collect_lines
        out = "".join(stdout_lines)
    if stderr_lines is not None:
        err = "".join(stderr_lines)
    return Result(proc.returncode, out or "", err or "")


def run_npurun(args: list[str], cwd: Path, env: dict[str, str] | None = None,
               timeout: float = LAUNCH_TIMEOUT) -> Result:
    return finish(start_npurun(args, cwd, env), timeout)


def worker_lines(result: Result, tag: str) -> dict[int, str]:
    """{rank: line} of lines '[rank<r>]: <tag> ...' printed by the workers."""
    found = {}
    for ln in result.stdout.splitlines():
        if ln.startswith("[rank") and f"]: {tag} " in ln:
            rank = int(ln[len("[rank"):ln.index("]")])
            found[rank] = ln.split(f"]: {tag} ", 1)[1]
    return found


def run_two_nodes(common: list[str], cwd: Path) -> list[Result]:
    """Start two npurun agents (node ranks 0 and 1, node ids sim0/sim1) sharing `common` args; wait for both."""
    procs = [start_npurun(["--node-rank", str(n), "--node-id", f"sim{n}", *common], cwd) for n in (0, 1)]
    return [finish(p) for p in procs]
