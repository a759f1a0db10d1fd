"""Kernel queue, public as ``torch.npu.launch`` (docs/device.md, "Asynchronous launch"): npu ops queue
their kernels on the current stream and return; ``ASCEND_LAUNCH_BLOCKING=1`` (or
``NPUDIST_LAUNCH_BLOCKING=1``), read once when the first op runs, makes every op synchronous, and so does
task-queue level 0 (``TASK_QUEUE_ENABLE=0`` or ``torch.npu.set_task_queue_enable(0)`` at run time).

Queued kernels must have run before the process forks (the child has no stream workers) or exits (workers
would compute while the interpreter shuts down): :func:`register` drains every device at both points.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys

from npudist import _C
from npudist.device import core


def is_blocking() -> bool:
    """True when npu ops run synchronously (``ASCEND_LAUNCH_BLOCKING=1``)."""
    return _C._launch_blocking()


def launch_counts() -> dict:
    """Ops by launch path since the last :func:`reset_launch_counts`: ``queued`` kernels, ``synchronous``
    ops (which drained the stream and ran on the calling thread), ``metadata`` ops (views, no data) and
    ``inline`` kernels (queueable, but faster than their hand-off to the stream's worker: run on the calling
    thread because the stream was idle; docs/device.md, "Launch window")."""
    return dict(_C._launch_counts())


def reset_launch_counts() -> None:
    _C._reset_launch_counts()


def utilization(device=None) -> int:
    """Percent (int, 0..100) of the past second during which one or more npu kernels of ``device`` (default:
    the current device) ran, on a stream's worker or on the launching thread (torch.cuda.utilization's
    definition with a 1 s sample period; docs/device.md, "Utilization")."""
    return _C._npu_utilization(core._checked_index(device))


@contextlib.contextmanager
def host_ordered(device: int):
    """Run a block whose host code reads and writes npu bytes directly, in order with queued kernels: the
    device's current stream is drained on entry, and npu ops inside run inline on this thread (their results
    are read right after by the same host code). Inductor's generated npu code runs in this scope: its C++
    kernels take raw pointers on the host (npudist.compile.inductor). A no-op under blocking launch."""
    if _C._launch_blocking():
        yield
        return
    _C._stream_synchronize(device, _C._current_stream(device))
    previous = _C._set_thread_inline_launch(True)
    try:
        yield
    finally:
        _C._set_thread_inline_launch(previous)


def host_ordered_call(fn):
    """``fn(args)`` run under :func:`host_ordered` on the current device: how Inductor's generated npu modules
    export their ``call`` (``NpuWrapperCodegen.generate_after_suffix``)."""

    @functools.wraps(fn)
    def call(args):
        with host_ordered(_C._current_device()):
            return fn(args)

    return call


def drain_all_devices() -> None:
    """Run every device's queued kernels to completion; a queued kernel's error is raised."""
    for device in range(_C._device_count()):
        _C._synchronize(device)


def _drain_all_devices() -> None:
    for device in range(_C._device_count()):
        try:
            _C._synchronize(device)
        except RuntimeError as e:  # a queued kernel failed and nobody synchronized since
            print(f"npudist: an asynchronous npu error was never synchronized: {e}", file=sys.stderr)


def register() -> None:
    atexit.register(_drain_all_devices)
    os.register_at_fork(before=_drain_all_devices)
