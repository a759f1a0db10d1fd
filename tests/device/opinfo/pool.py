"""Worker processes that run ops, replaced when one dies or exceeds the per-pair time limit.

Workers are forked from a zygote (see ``worker``). A crash (a signal such as SIGSEGV/SIGABRT, or any
exit) or a hang is recorded as the failure of the op x dtype being run at that moment, with the
sample index, form and call the worker last reported; the pool then forks a fresh worker and continues
with the op's remaining dtypes.

Each task (one op, its dtypes) runs in a fresh worker: the device's per-process state (the launch path's
per-signature inference cache, whose first call of a signature runs synchronously) then depends on that op
alone, not on which ops the worker ran before, so a sampled run and the long run see the same first calls.

A pool runs in one launch mode (``mode``: "async", the device's default, or "blocking", which sets
``ASCEND_LAUNCH_BLOCKING=1`` in the zygote's environment); the zygote confirms the mode the device read.
"""
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from .names import MODES, SYNC_FORMS

# The device's per-process memory record (device_core/include/npudist/runtime_usage.h), unlinked by an atexit
# handler that a worker's os._exit or a kill skips: the pool removes it when it reaps the worker.
USAGE_RECORD = "/dev/shm/npudist-usage-{pid}"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@dataclass
class Task:
    op: str
    dtypes: list
    more_forms: tuple = ()  # forms ("*": all) that run every sample, beyond the pool's max_samples


@dataclass
class _Slot:
    """A running worker and what it is doing."""
    pid: int
    sock: socket.socket
    stderr_path: str
    buf: bytes = b""
    task: Task | None = None
    dtype: str | None = None
    where: str = "before the first sample"
    form: str = "function"
    deadline: float = float("inf")
    stderr_pos: int = 0  # stderr written before the current pair is not its story
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
                 startup_timeout: float = 300.0, zygote_argv: list | None = None, mode: str = "async"):
        if mode not in MODES:
            raise ValueError(f"launch mode {mode!r}: expected one of {MODES}")
        self.size, self.max_samples, self.mode = size, max_samples, mode
        self.pair_timeout, self.startup_timeout = pair_timeout, startup_timeout
        # The zygote command; tests substitute a scripted one.
        self.zygote_argv = zygote_argv or [sys.executable, "-m", "tests.device.opinfo.worker"]
        self.slots: list[_Slot] = []
        self.catalog: dict[str, list[str]] | None = None
        self.restarts = 0
        self.zygote = None
        self.dir = tempfile.mkdtemp(prefix="npudist-opinfo-")
        self._forks = 0

    # -- zygote and worker lifecycle --------------------------------------------------------
    def load_catalog(self) -> dict[str, list[str]]:
        """Every op id of op_db with the dtypes the CPU supports for it (starts the zygote)."""
        if self.zygote is None:
            blocking = "1" if self.mode == "blocking" else "0"
            env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                       OMP_NUM_THREADS="1", ASCEND_LAUNCH_BLOCKING=blocking, NPUDIST_LAUNCH_BLOCKING=blocking)
            self.zygote_err = os.path.join(self.dir, "zygote.stderr")
            with open(self.zygote_err, "wb") as err:
                self.zygote = subprocess.Popen(self.zygote_argv, cwd=REPO, env=env, stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=err)
            msg = self._zygote_reply(self.startup_timeout)
            if msg.get("t") != "ready":
                raise RuntimeError(f"opinfo zygote sent {msg!r} instead of its catalog")
            if msg.get("blocking") != (self.mode == "blocking"):
                raise RuntimeError(f"opinfo zygote runs with blocking launch {msg.get('blocking')}, "
                                   f"the pool asked for {self.mode}")
            self.catalog = msg["ops"]
        return self.catalog

    def _zygote_reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        out = self.zygote.stdout
        while True:
            ready, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
            line = out.readline() if ready else None
            if not line:
                with open(self.zygote_err, errors="replace") as f:
                    tail = f.read()[-3000:]
                raise RuntimeError(f"opinfo zygote {'timed out' if line is None else 'died'}:\n{tail}")
            if line.startswith(b"{"):  # anything else is stray output of an import
                return json.loads(line)

    def _zygote_call(self, **cmd) -> dict:
        self.zygote.stdin.write((json.dumps(cmd) + "\n").encode())
        self.zygote.stdin.flush()
        return self._zygote_reply(self.startup_timeout)

    def _start(self) -> _Slot:
        self.load_catalog()
        self._forks += 1
        path = os.path.join(self.dir, f"w{self._forks}")
        listener = socket.socket(socket.AF_UNIX)
        try:
            listener.bind(path + ".sock")
            listener.listen(1)
            pid = self._zygote_call(cmd="fork", socket=path + ".sock", stderr=path + ".stderr")["pid"]
            listener.settimeout(self.startup_timeout)
            conn, _ = listener.accept()
        finally:
            listener.close()
            os.unlink(path + ".sock")
        conn.setblocking(True)
        return _Slot(pid, conn, path + ".stderr")

    def _stop(self, slot: _Slot) -> int:
        """Kill (if still running) and reap a worker; returns its exit status."""
        try:
            os.kill(slot.pid, signal.SIGKILL) if slot.task is not None else None
        except ProcessLookupError:
            pass
        slot.sock.close()
        status = self._zygote_call(cmd="wait", pid=slot.pid)["status"]
        try:
            os.unlink(USAGE_RECORD.format(pid=slot.pid))
        except FileNotFoundError:
            pass
        return status

    def close(self) -> None:
        for slot in self.slots:
            self._stop(slot)  # an idle worker exits when its socket closes
        self.slots = []
        if self.zygote is not None:
            self.zygote.stdin.close()
            try:
                self.zygote.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.zygote.kill()
                self.zygote.wait()
            self.zygote.stdout.close()
            self.zygote = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def _stderr_tail(slot: _Slot, n: int = 300) -> str:
        try:
            with open(slot.stderr_path, "rb") as f:
                f.seek(slot.stderr_pos)
                return " ".join(f.read().decode(errors="replace")[-n:].split())
        except FileNotFoundError:
            return ""

    def _stderr_size(self, slot: _Slot) -> int:
        try:
            return os.path.getsize(slot.stderr_path)
        except FileNotFoundError:
            return 0

    # -- tasks ------------------------------------------------------------------------------
    def _assign(self, slot: _Slot, task: Task) -> None:
        slot.task, slot.dtype, slot.done_dtypes = task, None, set()
        slot.deadline = time.monotonic() + self.pair_timeout
        slot.sock.sendall((json.dumps({"op": task.op, "dtypes": task.dtypes, "max_samples": self.max_samples,
                                       "more_forms": list(task.more_forms)}) + "\n").encode())

    def _failed_pair(self, slot: _Slot, status: str, how: str) -> dict:
        # A worker dies between pairs only if something outside an op killed it: blame the next one.
        dtype = slot.dtype or next((d for d in slot.task.dtypes if d not in slot.done_dtypes), "none")
        tail = self._stderr_tail(slot)
        slot.done_dtypes.add(dtype)
        message = f"{how} {slot.where}" + (f"; stderr: {tail}" if tail else "")
        form = {"samples": 0, "calls": 0, "agree": 0, "bitwise": 0, "drew": 0, "random_agree": 0,
                "failures": {status: message}, "status": status, "message": message}
        return {"op": slot.task.op, "dtype": dtype, "mode": self.mode, "status": status, "message": message,
                "forms": {slot.form: form}}

    def _replace(self, slot: _Slot, pending: list) -> None:
        """Fork a new worker in place of a dead or hung one; it gets the rest of the task."""
        task, done = slot.task, slot.done_dtypes
        new = self._start()
        self.restarts += 1
        self.slots[self.slots.index(slot)] = new
        rest = [d for d in task.dtypes if d not in done]
        if rest:
            self._assign(new, Task(task.op, rest, task.more_forms))
        elif pending:
            self._assign(new, pending.pop(0))

    def run(self, tasks):
        """Run every task; yield a record per op x dtype (see ``make_record``)."""
        pending = list(tasks)
        while len(self.slots) < min(self.size, max(1, len(pending))):
            self.slots.append(self._start())
        for slot in self.slots:
            if pending and slot.task is None:
                self._assign(slot, pending.pop(0))
        while any(s.task is not None for s in self.slots):
            busy = [s for s in self.slots if s.task is not None]
            wait = max(0.0, min(s.deadline for s in busy) - time.monotonic())
            ready, _, _ = select.select([s.sock for s in busy], [], [], wait)
            for slot in busy:
                eof = False
                if slot.sock in ready:
                    chunk = slot.sock.recv(1 << 16)
                    slot.buf += chunk
                    eof = not chunk
                while slot.task is not None and b"\n" in slot.buf:
                    line, slot.buf = slot.buf.split(b"\n", 1)
                    yield from self._handle(slot, json.loads(line), pending)
                if slot.task is None:
                    continue
                if eof:
                    code = self._stop(slot)
                    yield self._failed_pair(slot, "crash", f"worker died ({_signal_name(code)}) at")
                    self._replace(slot, pending)
                elif time.monotonic() > slot.deadline:
                    self._stop(slot)
                    yield self._failed_pair(slot, "timeout",
                                            f"no result within {self.pair_timeout:.0f} s, killed at")
                    self._replace(slot, pending)

    def _handle(self, slot: _Slot, msg: dict, pending: list):
        kind = msg["t"]
        if kind == "begin":
            slot.dtype, slot.where, slot.form = msg["dtype"], "before the first sample", "function"
            slot.deadline = time.monotonic() + self.pair_timeout
            slot.stderr_pos = self._stderr_size(slot)
        elif kind == "progress":
            slot.form = msg["form"]
            reference = "synchronous npu call" if msg["form"] in SYNC_FORMS else "cpu call"
            call = f"npu call {msg['call']}" if msg["call"] else reference
            slot.where = f"sample {msg['sample']} ({msg['form']} {call})"
        elif kind == "pair":
            slot.done_dtypes.add(msg["dtype"])
            slot.dtype = None
            yield make_record(msg["op"], msg["dtype"], self.mode, msg["result"])
        elif kind == "done":
            slot.task = None
            if pending:
                self._stop(slot)  # idle: its socket closes and it exits
                new = self._start()
                self.slots[self.slots.index(slot)] = new
                self._assign(new, pending.pop(0))


def make_record(op: str, dtype: str, mode: str, result: dict) -> dict:
    """A worker's op x dtype result as a record: per-form tallies and one overall ``status`` (the worst
    form's; the forms' own statuses are what the expected-failure list is checked against)."""
    rec = {"op": op, "dtype": dtype, "mode": mode, "seconds": round(result.get("seconds", 0.0), 3),
           "cpu_seconds": round(result.get("cpu_seconds", 0.0), 3)}
    if "harness_error" in result:
        rec.update(status="nosamples", message="CPU sample generation failed: " + result["harness_error"], forms={})
        return rec
    rec["forms"] = result["forms"]
    if not rec["forms"]:
        rec.update(status="nosamples", message="op_db has no samples for this dtype")
        return rec
    status, message = "agree", ""
    for form, tally in rec["forms"].items():
        if tally["status"] != "agree" and status == "agree":
            status, message = tally["status"], f"{form} {tally['message']}"
    rec.update(status=status, message=message)
    return rec
