"""The launcher's own lines: one at every (re)start of the local workers and one at exit."""
from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from .logs import WorkerGroupInfo, read_error_excerpt, read_error_message

PREFIX = "npurun:"


def format_ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    values = sorted(values)
    if not values:
        return "-"
    parts, start, prev = [], values[0], values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


@dataclass
class JobFacts:
    """What the launcher knows before the rendezvous."""

    device: str            # "npu" or "cpu"
    visible: int | None    # visible npu devices (None with --device cpu)
    node_id: str
    rdzv: str              # "c10d (standalone)", "static host:port", "c10d host:port id job"
    max_restarts: int
    worker_env: dict[str, str]  # variables that shape the workers (HCCL_*, OMP_NUM_THREADS)
    binds: bool = True     # False with --no-python: the program starts without the bootstrap


def _attempt_errors(info: WorkerGroupInfo) -> str:
    """One-line account of the Python errors a finished attempt recorded in its error files."""
    found = []
    for lr in sorted(info.error_files):
        message = read_error_message(info.error_files[lr])
        if message:
            found.append(f"rank {info.ranks.get(lr, lr)}: {message.splitlines()[0]}")
    return "; ".join(found) if found else f"a worker failed or the group changed (logs {info.log_dir})"


def _looks_stopped_by_agent(fail) -> bool:
    """The agent ends the surviving workers of a failed group with SIGTERM (SIGKILL only after its
    shutdown timeout, so a SIGKILL is treated as a failure of its own, e.g. the OOM killer)."""
    return fail.exitcode < 0 and fail.signal_name() == "SIGTERM"


def _no_excerpt(fail, stderr_file: str | None) -> str:
    """Why a failed rank has no error lines to show."""
    if fail.exitcode < 0:
        how = f"ended by {fail.signal_name()}"
    else:
        how = f"exited with code {fail.exitcode}"
    if stderr_file and os.path.isfile(stderr_file):
        return f"({how} without writing to stderr; its stdout is in the logs)"
    return f"({how}; its stderr went straight to the console (--tee/--redirects), so there is nothing to quote)"


def first_failed_rank(err: ChildFailedError) -> int:
    """The rank whose failure started it all.

    torchelastic orders failures by a timestamp in whole seconds, so a worker the agent stopped a moment
    later can tie with the real culprit; failures that are not the agent's own SIGTERM win.
    """
    real = {r: f for r, f in err.failures.items() if not _looks_stopped_by_agent(f)}
    if not real:
        return err.get_first_failure()[0]
    return min(real, key=lambda r: (real[r].timestamp, r))


class Reporter:
    """Prints the summary lines to stderr (worker output goes through torchrun's log tailers)."""

    def __init__(self, quiet: bool = False, stream=None) -> None:
        self.facts = JobFacts(device="npu", visible=None, node_id="?", rdzv="?", max_restarts=0, worker_env={})
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.started_at = time.monotonic()
        self.last: WorkerGroupInfo | None = None

    def _print(self, line: str) -> None:
        if not self.quiet:
            print(f"{PREFIX} {line}", file=self.stream, flush=True)

    def on_start(self, info: WorkerGroupInfo) -> None:
        prev, self.last = self.last, info
        f = self.facts
        if prev is not None and info.attempt > prev.attempt:
            self._print(f"restarting the workers ({info.attempt}/{f.max_restarts} restarts used) after "
                        f"attempt {prev.attempt + 1} ended: {_attempt_errors(prev)}")
        local = sorted(info.ranks)
        if f.device == "npu":
            devices = f"devices npu:{format_ranges(local)} of {f.visible} visible" + (
                "" if f.binds else " (not bound: --no-python)")
        else:
            devices = "devices cpu (no npu binding)"
        attempt = f"attempt {info.attempt + 1}/{f.max_restarts + 1}"
        env = " ".join(f"{k}={v}" for k, v in sorted(f.worker_env.items()))
        self._print(
            f"start {attempt}: nodes {info.num_nodes} (this: node {info.node_rank}, id {f.node_id!r}), "
            f"ranks {format_ranges(list(info.ranks.values()))} of {info.world_size}, {devices}, "
            f"rendezvous {f.rdzv}, master {info.master}"
            + (f", {env}" if env else "")
            + (f", logs {info.log_dir}" if info.log_dir else ""))

    def _where(self) -> str:
        info = self.last
        if info is None:
            return f"node id {self.facts.node_id!r}"
        return (f"node {info.node_rank} ({self.facts.node_id!r}), ranks "
                f"{format_ranges(list(info.ranks.values()))} of {info.world_size}")

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started_at:.1f}s"

    def on_success(self) -> None:
        attempts = (self.last.attempt + 1) if self.last else 1
        self._print(f"finished OK: {self._where()}, {attempts} attempt(s), {self._elapsed()}")

    def on_failure(self, err: ChildFailedError) -> None:
        root = first_failed_rank(err)
        parts = []
        for rank in sorted(err.failures):
            fail = err.failures[rank]
            how = f"signal {fail.signal_name()}" if fail.exitcode < 0 else f"exit code {fail.exitcode}"
            if rank != root and _looks_stopped_by_agent(fail):
                how += " (stopped after the failure)"
            elif rank == root and len(err.failures) > 1:
                how += " (first failure)"
            parts.append(f"rank {rank} (local {fail.local_rank}) {how}")
        attempts = (self.last.attempt + 1) if self.last else 1
        logs = f", logs {self.last.log_dir}" if self.last and self.last.log_dir else ""
        self._print(f"FAILED: {'; '.join(parts)} -- {self._where()}, {attempts} attempt(s), "
                    f"{self._elapsed()}{logs}")
        for rank in sorted(err.failures):
            fail = err.failures[rank]
            if rank != root and _looks_stopped_by_agent(fail):
                continue
            stderr_file = self.last.stderr_files.get(fail.local_rank) if self.last else None
            error_file = fail.error_file if fail.error_file and fail.error_file != "<N/A>" else None
            excerpt = read_error_excerpt(error_file, stderr_file) or [_no_excerpt(fail, stderr_file)]
            for line in excerpt:
                self._print(f"  rank {rank}: {line}")

    def on_launch_error(self, err: BaseException, verbose: bool = False) -> None:
        """The agent itself failed (rendezvous, store): one line, the traceback only with --verbose."""
        self._print(f"FAILED before the workers could run: {type(err).__name__}: {err} -- {self._where()}, "
                    f"{self._elapsed()}" + ("" if verbose else " (--verbose shows the traceback)"))
        if verbose:
            traceback.print_exception(err, file=self.stream)

    def on_signal(self, signame: str) -> None:
        self._print(f"stopped by {signame}: {self._where()}, {self._elapsed()}")
