"""``torch.npu.mstx``: Ascend's profiler markers (mark, ranges) as torch.profiler events.

A mark is a zero-length ``record_function`` event, a range (``range_push``/``range_pop`` nested per domain
and thread, ``range_start``/``range_end`` by id, ``mstx_range`` around a function) is one ``record_function``
event from start to end: they appear under their message in ``torch.profiler``/``torch_npu.profiler`` results
and traces, and cost almost nothing when no profiler runs. The event name is the message, prefixed by
``<domain>::`` outside the default domain. With ``stream=`` the marker is still a host event (the emulated
device has no separate device timeline for it). Invalid arguments warn and return torch_npu's error value
(-1 or 0), as torch_npu's markers never raise.
"""
from __future__ import annotations

import functools
import itertools
import threading
import warnings

import torch
from torch.autograd.profiler import record_function

__all__ = ["mstx"]

_local = threading.local()
_ids = itertools.count(1)
_open: dict[int, record_function] = {}
_lock = threading.Lock()


def _name(message: str, domain: str) -> str:
    return message if domain == "default" else f"{domain}::{message}"


def _valid(fn: str, message, stream, domain) -> bool:
    if message is not None and (not message or not isinstance(message, str)):
        warnings.warn(f"Invalid message for mstx.{fn}. Please provide a valid message string.")
        return False
    if not domain or not isinstance(domain, str):
        warnings.warn(f"Invalid domain for mstx.{fn}. Please provide a valid domain string.")
        return False
    if stream and not (isinstance(stream, torch.Stream) and stream.device.type == "npu"):
        warnings.warn(f"Invalid stream for mstx.{fn}. Please provide a valid torch.npu.Stream.")
        return False
    return True


def _stack(domain: str) -> list[record_function]:
    stacks = getattr(_local, "stacks", None)
    if stacks is None:
        stacks = _local.stacks = {}
    return stacks.setdefault(domain, [])


class mstx:  # noqa: N801 - torch_npu's name
    """Profiler markers (see the module documentation)."""

    @staticmethod
    def mark(message: str, stream=None, domain: str = "default") -> None:
        """An instantaneous marker named ``message``."""
        if _valid("mark", message, stream, domain):
            with record_function(_name(message, domain)):
                pass

    @staticmethod
    def range_push(message: str, stream=None, domain: str = "default") -> int:
        """Open a nested range on this thread; returns its depth (0 = outermost), -1 on invalid input."""
        if not _valid("range_push", message, stream, domain):
            return -1
        stack = _stack(domain)
        rf = record_function(_name(message, domain))
        rf.__enter__()
        stack.append(rf)
        return len(stack) - 1

    @staticmethod
    def range_pop(domain: str = "default") -> int:
        """Close this thread's innermost open range of ``domain``; returns its depth, -1 if none is open."""
        if not _valid("range_pop", None, None, domain):
            return -1
        stack = _stack(domain)
        if not stack:
            warnings.warn(f"mstx.range_pop: no open range in domain {domain!r} on this thread")
            return -1
        stack.pop().__exit__(None, None, None)
        return len(stack)

    @staticmethod
    def range_start(message: str, stream=None, domain: str = "default") -> int:
        """Open a range that any thread may end; returns its id (> 0) for :meth:`range_end`, 0 on invalid input."""
        if not _valid("range_start", message, stream, domain):
            return 0
        rf = record_function(_name(message, domain))
        rf.__enter__()
        range_id = next(_ids)
        with _lock:
            _open[range_id] = rf
        return range_id

    @staticmethod
    def range_end(range_id: int, domain: str = "default") -> None:
        """End the range ``range_start`` returned ``range_id`` for."""
        if not isinstance(range_id, int) or not _valid("range_end", None, None, domain):
            warnings.warn("Invalid range_id for mstx.range_end. Please provide the return value of mstx.range_start.")
            return
        with _lock:
            rf = _open.pop(range_id, None)
        if rf is None:
            warnings.warn(f"mstx.range_end: no open range with id {range_id}")
            return
        rf.__exit__(None, None, None)

    @staticmethod
    def mstx_range(message: str, stream=None, domain: str = "default"):
        """Decorator: every call of the function is a range named ``message``."""
        def wrapper(func):
            @functools.wraps(func)
            def inner(*args, **kwargs):
                range_id = mstx.range_start(message, stream, domain)
                try:
                    return func(*args, **kwargs)
                finally:
                    if range_id:
                        mstx.range_end(range_id, domain)
            return inner
        return wrapper
