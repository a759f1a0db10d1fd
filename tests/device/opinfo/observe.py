"""Observe one call of an op: its result or exception, its warnings, and whether it drew random numbers.

Warnings come two ways. Python's (and C++ ``TORCH_WARN`` raised on the calling thread, which torch turns
into Python warnings) are recorded with ``warnings.catch_warnings(record=True)`` and the "always" filter;
``torch._C._set_warnAlways(True)`` makes C++ warn-once warnings fire on every call, so the cpu call that ran
first does not silence the npu call. A C++ warning raised on another thread (an asynchronous launch's
stream worker) has no Python handler and is printed to stderr as ``[W... file:line] Warning: ...``: those
lines are read from the process's stderr file between the call's start and its synchronization.

Draws: the CPU generator's and npu:0's states are read before and after the call; a call drew if either
changed (both are seeded before every call, so a state change is this call's doing). op_db calls its
random ops through ``wrapper_set_seed``, which seeds 42 inside ``freeze_rng_state`` and restores both
generators afterwards, hiding the draw: :func:`expose_draws` turns that block into a plain one, and calls
are seeded with 42 too, so the wrapper's reseeding leaves the states as they were unless the op drew.
"""
import contextlib
import os
import re
import stat
import warnings
from dataclasses import dataclass

import torch

# Warn-once warnings that fire per tensor allocated under warn-always: a user sees each once per process on
# either device, but the npu allocates other tensors internally (meta stand-ins, CPU aliases) than cpu.
PER_ALLOCATION_WARNINGS = ("ComplexHalf support is experimental",)
SEED = 1234  # samples
CALL_SEED = 42  # calls: wrapper_set_seed's seed
_CXX_WARNING = re.compile(r"^\[W[^\]]*\] Warning: (.*?)(?: \(function [^)]*\))?$")


def expose_draws() -> None:
    """Make op_db's ``wrapper_set_seed`` keep the generator states its op leaves (see the module doc)."""
    import torch.testing._utils as testing_utils
    testing_utils.freeze_rng_state = contextlib.nullcontext


def seed(value: int) -> None:
    """Seed the CPU generator and npu:0's (the devices samples use). ``torch.manual_seed`` would do
    too, but it also walks the cuda/xpu/mtia lazy-init queues, which was 65% of the suite's time."""
    torch.default_generator.manual_seed(value)
    torch.npu.manual_seed(value)


@dataclass
class Call:
    out: object = None
    exc: BaseException | None = None
    warnings: tuple = ()  # (category name, message) of Python warnings, in order
    stderr_warnings: tuple = ()  # messages of C++ warnings printed to stderr (another thread's)
    drew: bool = False


class StderrWatch:
    """Reads what the process wrote to fd 2 since a mark, when fd 2 is a regular file (a pool worker's
    stderr, pytest's fd capture); elsewhere ``available`` is False and nothing is read. Follows fd 2 when it
    is replaced by another file."""

    def __init__(self):
        self._file, self._fd, self.available = None, None, False

    def mark(self) -> int:
        st = os.fstat(2)
        self.available = stat.S_ISREG(st.st_mode)
        if self.available and self._file != (st.st_dev, st.st_ino):
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self._file = os.open("/proc/self/fd/2", os.O_RDONLY), (st.st_dev, st.st_ino)
        return st.st_size if self.available else 0

    def warnings_since(self, mark: int) -> tuple:
        if not self.available:
            return ()
        end = os.fstat(2).st_size
        if end <= mark:
            return ()
        text = os.pread(self._fd, end - mark, mark).decode(errors="replace")
        return tuple(m.group(1) for m in map(_CXX_WARNING.match, text.splitlines()) if m)


_watch = StderrWatch()


def observe(fn, on_npu: bool) -> Call:
    """Run ``fn()`` from freshly seeded generators and record what it did. On npu the call is followed by a
    synchronization inside the observation, so a queued kernel's failure or warning belongs to this call."""
    watch = _watch
    seed(CALL_SEED)
    cpu_state, npu_state = torch.get_rng_state(), torch.npu.get_rng_state()
    mark = watch.mark()
    call = Call()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call.out = fn()
            if on_npu:
                torch.npu.synchronize()
        except Exception as e:  # noqa: BLE001 - any exception is behaviour to compare
            call.out, call.exc = None, e
    if on_npu:
        try:
            torch.npu.synchronize()  # after a raise, too: later calls must not inherit this one's queue
        except Exception as e:  # noqa: BLE001
            call.exc = call.exc or e
    call.warnings = tuple((w.category.__name__, str(w.message)) for w in caught
                          if not str(w.message).startswith(PER_ALLOCATION_WARNINGS))
    call.stderr_warnings = watch.warnings_since(mark)
    call.drew = not (torch.equal(torch.get_rng_state(), cpu_state) and torch.equal(torch.npu.get_rng_state(), npu_state))
    return call


def compare_warnings(cpu: Call, npu: Call, names=("cpu", "npu")) -> str:
    """'' if npu warned as cpu did (the same distinct categories and messages, on the same channel), else what
    differs. Distinct, not counted: with warn-once warnings firing always, one call may repeat a warning
    once per internal step, and the npu takes other internal steps than cpu. ``names``: what the message calls
    the reference and the compared call."""
    ref, got = names
    cpu_w, npu_w = set(cpu.warnings), set(npu.warnings)
    if cpu_w != npu_w:
        more = [w for w in npu.warnings if w not in cpu_w]
        fewer = [w for w in cpu.warnings if w not in npu_w]
        return "; ".join(([f"{got} warned {_fmt(more)} where {ref} did not"] if more else []) +
                         ([f"{got} did not warn {_fmt(fewer)} as {ref} did"] if fewer else []))
    more = [w for w in npu.stderr_warnings if w not in set(cpu.stderr_warnings)]
    if more:
        return f"{got} printed {len(more)} C++ warning(s) to stderr from another thread: {more[0][:160]!r}"
    fewer = [w for w in cpu.stderr_warnings if w not in set(npu.stderr_warnings)]
    if fewer:
        return f"{got} did not print the C++ warning {ref} printed to stderr: {fewer[0][:160]!r}"
    return ""


def _fmt(ws) -> str:
    return ", ".join(f"{c}({m[:120]!r})" for c, m in ws[:2]) + (f" and {len(ws) - 2} more" if len(ws) > 2 else "")
