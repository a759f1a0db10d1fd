"""Binding the calling thread to CPU cores (torch_npu's ``set_thread_affinity``): on the emulated device the
npu kernels run on host cores, so this binding applies to the work the thread launches inline as well."""
from __future__ import annotations

import os

_initial = os.sched_getaffinity(0)


def _cores(core_range) -> set[int]:
    ranges = [core_range] if (isinstance(core_range, list) and len(core_range) == 2
                              and all(isinstance(x, int) for x in core_range)) else core_range
    if not (isinstance(ranges, list) and ranges and all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and x >= 0 for x in r) and r[0] <= r[1]
            for r in ranges)):
        raise ValueError(f"set_thread_affinity: core_range must be None, [start, end] or [[start, end], ...] "
                         f"with 0 <= start <= end, got {core_range!r}")
    cores = {c for start, end in ranges for c in range(start, end + 1)}
    available = os.sched_getaffinity(0) | _initial
    if not cores & available:
        raise ValueError(f"set_thread_affinity: none of the cores {sorted(cores)} is available "
                         f"(available: {sorted(available)})")
    return cores & available


def set_thread_affinity(core_range=None) -> None:
    """Bind the calling thread to the cores of ``core_range`` (inclusive ranges); None restores the affinity
    the process started with."""
    os.sched_setaffinity(0, _initial if core_range is None else _cores(core_range))


def reset_thread_affinity() -> None:
    """Restore the calling thread's affinity to the one the process started with."""
    os.sched_setaffinity(0, _initial)
