"""Trace hooks of npu synchronization: every synchronization that goes through torch.npu (stream creation,
event record/wait, stream/event/device synchronize) is reported to the callables registered with
:func:`register_trace_hook` (the stream sanitizer, docs/debugging.md). With no hook registered the cost is
one list test at the call site (``if hooks:``).

A module of its own so that ``core`` (device synchronize) and ``streams`` (streams and events) both report
here without importing each other.
"""
from __future__ import annotations

from typing import Callable

# Hooks called as hook(kind, *args); kinds and args:
#   "stream_create" (stream_key,)        "event_record" (event_id, stream_key)
#   "event_wait" (event_id, stream_key)  "event_synchronize" (event_id,)
#   "stream_synchronize" (stream_key,)   "device_synchronize" (device_index,)
# stream_key is (device_index, stream_id).
hooks: list[Callable[..., None]] = []


def register_trace_hook(hook: Callable[..., None]) -> Callable[[], None]:
    """Call ``hook(kind, *args)`` on every npu stream/event synchronization; returns a function removing it."""
    hooks.append(hook)
    return lambda: hooks.remove(hook) if hook in hooks else None


def trace(kind: str, *args) -> None:
    for hook in list(hooks):
        hook(kind, *args)
