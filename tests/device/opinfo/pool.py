"""Worker processes that run ops, replaced when one dies or exceeds the per-pair time limit.

A crash (a signal such as SIGSEGV/SIGABRT, or any exit) or a hang is recorded as the failure of the
op x dtype being run at that moment, with the sample index and phase the worker last reported; the
pool then starts a fresh worker and continues with the op's remaining dtypes.
"""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@dataclass
class Task:
    op: str
    dtypes: list


@dataclass
class _Slot:
    """A running worker and what it is doing."""
    proc: subprocess.Popen
    fd: int
    stderr: object
    buf: bytes = b""
    task: Task | None = None
    dtype: str | None = None
    where: str = "before the first sample"
    deadline: float = float("inf")
    done_dtypes: set = field(default_factory=set)


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class Pool:
    """``size`` worker processes; ``run(tasks)`` yields one record per op x dtype."""

    def __init__(self, size: int = 1, max_samples: int | None = None, pair_timeout: float = 120.0,
                 startup_timeout: float = 300.0):
        self.size, self.max_samples = size, max_samples
        self.pair_timeout, self.startup_timeout = pair_timeout, startup_timeout
        self.slots: list[_Slot] = []
        self.catalog: dict[str, list[str]] = {}
        self.restarts = 0

    # -- worker lifecycle -------------------------------------------------------------------
    def _start(self) -> _Slot:
        r, w = os.pipe()
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   OMP_NUM_THREADS="1")
        err = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, "-m", "tests.device.opinfo.worker", str(w)], cwd=REPO,
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                                pass_fds=(w,))
        os.close(w)
        slot = _Slot(proc, r, err)
        msg = self._read(slot, time.monotonic() + self.startup_timeout)
        if msg is None or msg.get("t") != "ready":
            self._stop(slot)
            raise RuntimeError(f"opinfo worker failed to start ({msg!r}):\n{self._stderr_tail(slot, 3000)}")
        self.catalog = msg["ops"]
        return slot

    def _stop(self, slot: _Slot) -> None:
        if slot.proc.poll() is None:
            slot.proc.kill()
        slot.proc.wait()
        for f in (slot.proc.stdin,):
            try:
                f.close()
            except OSError:
                pass
        os.close(slot.fd)
        slot.stderr.close()

    def close(self) -> None:
        for slot in self.slots:
            self._stop(slot)
        self.slots = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def load_catalog(self) -> dict[str, list[str]]:
        """Every op id of op_db with the dtypes the CPU supports for it (starts the first worker)."""
        if not self.slots:
            self.slots.append(self._start())
        return self.catalog

    @staticmethod
    def _stderr_tail(slot: _Slot, n: int = 600) -> str:
        slot.stderr.seek(0)
        data = slot.stderr.read().decode(errors="replace")
        return data[-n:].strip()

    # -- messages ---------------------------------------------------------------------------
    def _read(self, slot: _Slot, deadline: float):
        """The next message, None at EOF; raises TimeoutError after ``deadline``."""
        while b"\n" not in slot.buf:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise TimeoutError
            ready, _, _ = select.select([slot.fd], [], [], timeout)
            if not ready:
                continue
            chunk = os.read(slot.fd, 1 << 16)
            if not chunk:
                return None
            slot.buf += chunk
        line, slot.buf = slot.buf.split(b"\n", 1)
        return json.loads(line)

    def _assign(self, slot: _Slot, task: Task) -> None:
        slot.task, slot.dtype, slot.done_dtypes = task, None, set()
        slot.deadline = time.monotonic() + self.pair_timeout
        slot.proc.stdin.write((json.dumps({"op": task.op, "dtypes": task.dtypes,
                                           "max_samples": self.max_samples}) + "\n").encode())
        slot.proc.stdin.flush()

    def _failed_pair(self, slot: _Slot, status: str, how: str) -> dict:
        # A worker dies between pairs only if something outside an op killed it: blame the next one.
        dtype = slot.dtype or next((d for d in slot.task.dtypes if d not in slot.done_dtypes), "none")
        tail = self._stderr_tail(slot)
        msg = f"{how} {slot.where}" + (f"; stderr: {tail[-300:]}" if tail else "")
        slot.done_dtypes.add(dtype)
        return {"op": slot.task.op, "dtype": dtype, "status": status, "message": msg}

    def _replace(self, slot: _Slot) -> _Slot:
        """Stop a dead or hung worker, start a new one and give it the rest of the task."""
        task, done = slot.task, slot.done_dtypes
        self._stop(slot)
        self.restarts += 1
        new = self._start()
        self.slots[self.slots.index(slot)] = new
        rest = [d for d in task.dtypes if d not in done]
        if rest:
            self._assign(new, Task(task.op, rest))
        return new

    # -- the loop ---------------------------------------------------------------------------
    def run(self, tasks):
        """Run every task; yield a record per op x dtype (see ``make_record``)."""
        pending = list(tasks)
        while len(self.slots) < min(self.size, max(1, len(pending))):
            self.slots.append(self._start())
        for slot in self.slots:
            if pending:
                self._assign(slot, pending.pop(0))
        while any(s.task is not None for s in self.slots):
            busy = [s for s in self.slots if s.task is not None]
            wait = max(0.0, min(s.deadline for s in busy) - time.monotonic())
            ready_fds, _, _ = select.select([s.fd for s in busy], [], [], wait)
            for slot in busy:
                eof = False
                if slot.fd in ready_fds:
                    chunk = os.read(slot.fd, 1 << 16)
                    slot.buf += chunk
                    eof = not chunk
                while slot.task is not None and b"\n" in slot.buf:
                    line, slot.buf = slot.buf.split(b"\n", 1)
                    yield from self._handle(slot, json.loads(line), pending)
                if slot.task is None:
                    continue
                if eof:
                    code = slot.proc.wait()
                    yield self._failed_pair(slot, "crash", f"worker died ({_signal_name(code)}) at")
                    self._after_failure(slot, pending)
                elif time.monotonic() > slot.deadline:
                    yield self._failed_pair(slot, "timeout",
                                            f"no result within {self.pair_timeout:.0f} s, killed at")
                    self._after_failure(slot, pending)

    def _handle(self, slot: _Slot, msg: dict, pending: list):
        kind = msg["t"]
        if kind == "begin":
            slot.dtype, slot.where = msg["dtype"], "before the first sample"
            slot.deadline = time.monotonic() + self.pair_timeout
        elif kind == "progress":
            slot.where = f"sample {msg['sample']} ({msg['phase']})"
        elif kind == "pair":
            slot.done_dtypes.add(msg["dtype"])
            slot.dtype = None
            yield make_record(msg["op"], msg["dtype"], msg["result"])
        elif kind == "done":
            slot.task = None
            if pending:
                self._assign(slot, pending.pop(0))

    def _after_failure(self, slot: _Slot, pending: list) -> None:
        new = self._replace(slot)
        if new.task is None and pending:
            self._assign(new, pending.pop(0))


def make_record(op: str, dtype: str, result: dict) -> dict:
    """Flatten a worker's op x dtype result into a record with one overall ``status``."""
    rec = {"op": op, "dtype": dtype, "seconds": round(result.get("seconds", 0.0), 3)}
    if "harness_error" in result:
        rec.update(status="nosamples", message="CPU sample generation failed: " + result["harness_error"])
        return rec
    rec["forward"], rec["backward"] = result["forward"], result.get("backward")
    if result["forward"]["samples"] == 0:
        rec.update(status="nosamples", message="op_db has no samples for this dtype")
        return rec
    status, message = "agree", ""
    for phase in ("forward", "backward"):
        tally = result.get(phase)
        if tally and tally["status"] != "agree" and status == "agree":
            status, message = tally["status"], f"{phase} {tally['message']}"
    rec.update(status=status, message=message)
    return rec
