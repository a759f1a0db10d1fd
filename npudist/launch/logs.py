"""Worker output handling: torchrun's DefaultLogsSpecs plus a global-rank console filter and a hook
that reports each (re)start of the local worker group.

``LogsSpecs.reify`` is the one public extension point torchrun calls after the rendezvous, with the
environment of every local worker (RANK, WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RESTART_COUNT...), on the
first start and on every restart. That is exactly the information the start summary needs, so npurun
hooks it there instead of replacing torchrun's agent.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, LogsDest, Std

_NO_RANK = -1  # a local-rank filter that matches nobody (an empty set would mean "no filter")


@dataclass
class WorkerGroupInfo:
    """What the agent assigned to this node's workers at one (re)start."""

    attempt: int
    node_rank: int
    num_nodes: int
    world_size: int
    ranks: dict[int, int]  # local rank -> global rank
    master: str
    run_id: str
    log_dir: str
    stderr_files: dict[int, str] = field(default_factory=dict)
    error_files: dict[int, str] = field(default_factory=dict)


class NpurunLogsSpecs(DefaultLogsSpecs):
    """DefaultLogsSpecs that also filters the console by global rank and reports every start."""

    def __init__(
        self,
        log_dir: str | None,
        redirects: Std | dict[int, Std],
        tee: Std | dict[int, Std],
        local_ranks_filter: set[int] | None = None,
        global_ranks_filter: set[int] | None = None,
        on_start: Callable[[WorkerGroupInfo], None] | None = None,
    ) -> None:
        super().__init__(log_dir=log_dir, redirects=redirects, tee=tee, local_ranks_filter=local_ranks_filter)
        self._user_local_filter = local_ranks_filter
        self._global_filter = global_ranks_filter
        self._on_start = on_start
        self.last_start: WorkerGroupInfo | None = None

    def _console_local_ranks(self, ranks: dict[int, int]) -> set[int] | None:
        shown = set(ranks)
        if self._user_local_filter:
            shown &= self._user_local_filter
        if self._global_filter is not None:
            shown = {lr for lr in shown if ranks[lr] in self._global_filter}
        if shown == set(ranks):
            return None
        return shown or {_NO_RANK}

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        ranks = {lr: int(env["RANK"]) for lr, env in envs.items()}
        self._local_ranks_filter = self._console_local_ranks(ranks)
        dest = super().reify(envs)
        first = envs[min(envs)] if envs else {}
        info = WorkerGroupInfo(
            attempt=int(first.get("TORCHELASTIC_RESTART_COUNT", "0")),
            node_rank=int(first.get("GROUP_RANK", "0")),
            num_nodes=int(first.get("GROUP_WORLD_SIZE", "1")),
            world_size=int(first.get("WORLD_SIZE", str(len(envs)))),
            ranks=ranks,
            master=f"{first.get('MASTER_ADDR', '?')}:{first.get('MASTER_PORT', '?')}",
            run_id=first.get("TORCHELASTIC_RUN_ID", ""),
            log_dir=_attempt_dir(dest),
            stderr_files={lr: p for lr, p in dest.stderrs.items() if p and p != os.devnull},
            error_files={lr: p for lr, p in dest.error_files.items() if p and p != os.devnull},
        )
        self.last_start = info
        if self._on_start is not None:
            self._on_start(info)
        return dest


def _attempt_dir(dest: LogsDest) -> str:
    """<log_dir>/<run_id>_xxx/attempt_<n>, derived from <attempt dir>/<local rank>/error.json."""
    for path in dest.error_files.values():
        if path and path != os.devnull:
            return os.path.dirname(os.path.dirname(path))
    return ""


def read_error_message(error_file: str) -> str | None:
    """The one-line 'ExceptionType: message' a worker recorded in its error file, if any."""
    try:
        with open(error_file) as fp:
            msg = json.load(fp).get("message", "")
    except (OSError, ValueError):
        return None
    if isinstance(msg, dict):
        msg = msg.get("message", "")
    return str(msg).strip() or None


def read_error_excerpt(error_file: str | None, stderr_file: str | None, max_lines: int = 4) -> list[str]:
    """The lines that say what went wrong in a failed worker.

    Prefers the traceback torchelastic's error file recorded (see ``summarize_traceback``: the user's own
    line, where the library raised, the exception), else the tail of the worker's captured stderr without
    C++ backtrace frames (crashes that raised no Python exception, e.g. the hccl watchdog tearing a process
    down).
    """
    if error_file and os.path.isfile(error_file):
        try:
            with open(error_file) as fp:
                data = json.load(fp)
            msg = data.get("message", "")
            if isinstance(msg, dict):
                text = msg.get("extraInfo", {}).get("py_callstack") or msg.get("message", "")
            else:
                text = str(msg)
            lines = summarize_traceback(text, max_lines)
            if lines:
                return lines
        except (OSError, ValueError):
            pass
    if stderr_file and os.path.isfile(stderr_file):
        try:
            with open(stderr_file, errors="replace") as fp:
                lines = [ln.rstrip("\n") for ln in fp if ln.strip() and not _is_backtrace_noise(ln)]
        except OSError:
            return []
        heads = [i for i, ln in enumerate(lines) if _ERROR_HEAD.match(ln)]
        # A multi-line error message ("error: invalid plan ...: 5 errors" and one line per error): from its
        # first line, which names the problem, rather than the tail of its list.
        start = heads[-1] if heads and len(lines) - heads[-1] > max_lines else max(0, len(lines) - max_lines)
        return [_clip(ln) for ln in lines[start:start + max_lines]]
    return []


_ERROR_HEAD = re.compile(r"^(\S+: )?(error|[A-Za-z_.]*(Error|Exception))\b", re.IGNORECASE)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.*)$')
_CARETS = re.compile(r"^\s*[\^~]+\s*$")


def _library_dirs() -> tuple[str, ...]:
    """Where code that is not the user's lives: torch, npudist (and its launcher), the standard library and
    installed packages. A traceback's last frame outside them is the user's line that led to the error."""
    import sysconfig

    import torch

    import npudist

    dirs = {os.path.dirname(torch.__file__), os.path.dirname(npudist.__file__),
            os.path.dirname(os.path.abspath(__file__))}
    dirs.update(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


def _is_library(path: str, libs: tuple[str, ...]) -> bool:
    return path.startswith("<") or os.path.realpath(path).startswith(libs)


def summarize_traceback(text: str, max_lines: int = 4) -> list[str]:
    """The frame of the user's code closest to the error (its ``File`` line and source line), a note naming
    the library line that raised when that is deeper (e.g. torch's distributed_c10d.py), and the exception
    (up to ``max_lines`` lines). Text without a traceback: its last ``max_lines`` non-empty lines."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not _CARETS.match(ln)]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    lines = lines[starts[-1]:] if starts else lines    # the last exception of a chain is the one raised
    frames = [(i, m) for i, ln in enumerate(lines) if (m := _FRAME.match(ln))]
    if not frames:
        return lines[-max_lines:]
    end = frames[-1][0] + 1
    while end < len(lines) and lines[end].startswith("    ") and not _FRAME.match(lines[end]):
        end += 1                                         # the innermost frame's source line
    exception = lines[end:][:max_lines]
    libs = _library_dirs()
    user = [(i, m) for i, m in frames if not _is_library(m.group("file"), libs)]
    i, m = user[-1] if user else frames[-1]
    out = [lines[i]]
    if i + 1 < len(lines) and lines[i + 1].startswith("    ") and not _FRAME.match(lines[i + 1]):
        out.append(lines[i + 1])
    inner = frames[-1][1]
    if user and inner is not m:
        out.append(f"  (raised in {_short_path(inner.group('file'))}, line {inner.group('line')}, "
                   f"in {inner.group('func')})")
    return [_clip(ln) for ln in out + exception]


def _short_path(path: str) -> str:
    """torch/distributed/distributed_c10d.py rather than the whole site-packages path."""
    parts = path.replace(os.sep, "/").split("/")
    for anchor in ("torch", "npudist", "launch"):
        if anchor in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor):])
    return path


_BACKTRACE_NOISE = re.compile(r"^\s*(frame #\d+:|<omitting python frames>|Exception raised from .* \(most recent call first\):)")


def _is_backtrace_noise(line: str) -> bool:
    """c10's C++ backtrace lines: they bury the error message that precedes them."""
    return bool(_BACKTRACE_NOISE.match(line))


def _clip(line: str, limit: int = 400) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."
