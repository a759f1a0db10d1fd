"""NPUGraph task update (torch_npu's ``graph_task_group_*``, ``graph_task_update_*`` and ``ExternalEvent``).

Inside a capture, the ops issued on the capturing stream between :func:`graph_task_group_begin` and
:func:`graph_task_group_end` form a task group; ``graph_task_group_end`` returns its handle. After the capture,
:func:`graph_task_update_begin` on an update stream, the same ops issued again there with new arguments (host
scalars such as ``actual_seq_lengths`` lists, or other tensors), then :func:`graph_task_update_end`, make later
replays run the group with the new arguments. An :class:`ExternalEvent` waited on (and reset) inside the capture
and recorded on the update stream after the update orders the update before the replay. docs/graph_task_update.md
describes the protocol and where it differs from a device graph (the re-issued ops run once on the update stream).
"""
from __future__ import annotations

from typing import Any

import torch

from npudist import _C
from npudist.device import streams


def _stream_arg(call: str, stream: Any) -> tuple[int, int]:
    if stream is None:
        stream = streams.current_stream()
    if not isinstance(stream, torch.Stream) or stream.device.type != "npu":
        raise ValueError(f"{call}: stream must be an npu stream (torch.npu.Stream() or torch.npu.current_stream()), "
                         f"got {stream!r}")
    return stream.device_index, stream.stream_id


def graph_task_group_begin(stream: torch.Stream) -> None:
    """Open a task group on ``stream``, which must be capturing an NPUGraph; groups do not nest."""
    _C._graph_task_group_begin(*_stream_arg("graph_task_group_begin", stream))


def graph_task_group_end(stream: torch.Stream) -> Any:
    """Close the task group open on ``stream``; returns its handle for :func:`graph_task_update_begin`."""
    return _C._graph_task_group_end(*_stream_arg("graph_task_group_end", stream))


def graph_task_update_begin(stream: torch.Stream, handle: Any) -> None:
    """Start updating the task group ``handle`` from ``stream`` (not the graph's capture stream).

    Issue the group's ops again on ``stream`` (the same ops in the same order, with new arguments), then call
    :func:`graph_task_update_end`.
    """
    if not isinstance(handle, _C._GraphTaskGroup):
        raise ValueError(f"graph_task_update_begin: handle must be what graph_task_group_end returned, got "
                         f"{type(handle).__name__}")
    device, stream_id = _stream_arg("graph_task_update_begin", stream)
    _C._graph_task_update_begin(device, stream_id, handle)


def graph_task_update_end(stream: torch.Stream) -> None:
    """Finish the update started on ``stream``: later replays run the group's ops with the new arguments.

    Raises ValueError (and the group keeps its tasks) when the re-issued ops differ from the captured ones in
    number or names, or change the shape of a result that tasks after the group read.
    """
    _C._graph_task_update_end(*_stream_arg("graph_task_update_end", stream))


class ExternalEvent:
    """An event a stream may wait on before it is recorded (torch_npu's ``ExternalEvent``).

    ``record(stream)`` sets its flag in ``stream``'s order, ``wait(stream)`` holds ``stream`` until the flag is set,
    ``reset(stream)`` clears it (call it after the wait, before the event is reused). Issued on a capturing stream,
    each call becomes a node of the graph that every replay runs. Under synchronous launch a wait on an event that
    is not recorded raises instead of blocking forever.
    """

    def __init__(self):
        self._event = _C._ExternalEvent()

    def record(self, stream: torch.Stream | None = None) -> None:
        """Set the event's flag after the work issued on ``stream`` (default: the current stream)."""
        self._event.record(*_stream_arg("ExternalEvent.record", stream))

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Make later work on ``stream`` (default: the current stream) wait until the event is recorded."""
        self._event.wait(*_stream_arg("ExternalEvent.wait", stream))

    def reset(self, stream: torch.Stream | None = None) -> None:
        """Clear the event's flag in ``stream``'s order (default: the current stream)."""
        self._event.reset(*_stream_arg("ExternalEvent.reset", stream))

    def query(self) -> bool:
        """True if the event is recorded (its flag is set) now."""
        return self._event.query()

    def __repr__(self) -> str:
        return f"<torch.npu.ExternalEvent {'recorded' if self.query() else 'not recorded'}>"


__all__ = ["ExternalEvent", "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin",
           "graph_task_update_end"]
