"""torch.npu streams and events (mirror torch.cuda.Stream/Event on top of torch.Stream/torch.Event).

Semantics (see docs/device.md): npu ops and the work other components enqueue on a stream
(``npudist._C._runtime_api()``) run asynchronously in order; an event completes when its stream has
passed it; ``wait_event``/``wait_stream`` make the waiting stream's queue wait for it (the host only with
``ASCEND_LAUNCH_BLOCKING=1``).

Every synchronization here is reported to the trace hooks of :mod:`npudist.device.sync_trace` (the stream
sanitizer, docs/debugging.md).
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch

from npudist import _C
from npudist.device import core
from npudist.device import sync_trace


def stream_key(stream: torch.Stream) -> tuple[int, int]:
    """(device_index, stream_id): identifies an npu stream across torch.Stream wrappers."""
    return stream.device_index, stream.stream_id


class _NpuStreamBase(torch.Stream):
    """What every npu stream class shares (torch_npu's ``_NPUStreamBase``): waits, events, synchronization."""

    def wait_event(self, event: torch.Event) -> None:
        """Order all later work on this stream after ``event`` (the host waits only under blocking launch)."""
        # torch.Event.wait, not event.wait: a plain torch.Event would skip the trace.
        torch.Event.wait(event, self)
        if sync_trace.hooks:
            sync_trace.trace("event_wait", event.event_id, stream_key(self))

    def wait_stream(self, stream: torch.Stream) -> None:
        """Order all later work after the work enqueued on ``stream`` so far."""
        # Event.record, not stream.record_event: a plain torch.Stream (torch.accelerator) would skip the trace.
        event = Event()
        event.record(stream)
        self.wait_event(event)

    def synchronize(self) -> None:
        """Block the host until all work enqueued on this stream has completed."""
        super().synchronize()
        if sync_trace.hooks:
            sync_trace.trace("stream_synchronize", stream_key(self))

    def record_event(self, event: torch.Event | None = None) -> Event:
        """Record ``event`` (a new one if None) on this stream and return it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    @property
    def npu_stream(self) -> int:
        """The stream id (what the runtime C API takes)."""
        return self.stream_id

    @property
    def priority(self) -> int:
        return _C._stream_priority(self.stream_id)

    def __ne__(self, o) -> bool:  # torch.Stream's own != compares ids only, not the subclass's __eq__
        return not self.__eq__(o)

    def __hash__(self):
        return hash((self.stream_id, self.device))


def _sync_launch_stream(device: Any) -> tuple[int, int]:
    """(device index, stream id) of a stream of ``device``'s sync-launch pool."""
    idx = core._checked_index(device)
    return idx, _C._sync_launch_stream(idx)


def _check_priority(cls: type, priority: Any) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"torch.npu.{cls.__name__}: priority must be an int, got {type(priority).__name__}")


class Stream(_NpuStreamBase):
    """An npu stream. ``Stream(device=None, priority=0)``; priority < 0 selects the high-priority pool.
    ``is_sync_launch=1`` (torch_npu's keyword) takes a stream of the sync-launch pool (:class:`SyncLaunchStream`)."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs and "device_index" in kwargs:
            return super().__new__(cls, priority=priority, **kwargs)
        _check_priority(cls, priority)
        if kwargs.pop("is_sync_launch", 0):
            idx, sid = _sync_launch_stream(device)
            s = super().__new__(cls, stream_id=sid, device_index=idx, device_type=_NPU_TYPE)
        else:
            idx = core._checked_index(device)
            s = super().__new__(cls, device=torch.device("npu", idx), priority=priority)
        if sync_trace.hooks:
            sync_trace.trace("stream_create", stream_key(s))
        return s

    def __eq__(self, o) -> bool:
        return isinstance(o, torch.Stream) and torch.Stream.__eq__(self, o)

    __hash__ = _NpuStreamBase.__hash__

    def __repr__(self) -> str:
        return f"<torch.npu.Stream device={self.device} npu_stream={self.stream_id:#x}>"


class SyncLaunchStream(_NpuStreamBase):
    """torch_npu's stream "which doesn't enable taskqueue": every npu kernel launched while it is the current
    stream runs on the launching thread before the call returns (so a kernel's error is raised at the call), after
    the work queued on this stream and the events it waits for; other streams keep queueing. A fixed pool of
    streams per device serves it (``priority`` is accepted and, as in torch_npu, not used)."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs and "device_index" in kwargs:
            return super().__new__(cls, **kwargs)
        _check_priority(cls, priority)
        if kwargs:
            raise TypeError(f"torch.npu.SyncLaunchStream: unexpected keyword argument(s) {sorted(kwargs)}")
        idx, sid = _sync_launch_stream(device)
        s = super().__new__(cls, stream_id=sid, device_index=idx, device_type=_NPU_TYPE)
        if sync_trace.hooks:
            sync_trace.trace("stream_create", stream_key(s))
        return s

    def query(self) -> bool:
        """True when all work submitted to this stream has completed."""
        return super().query()

    def set_data_preprocess_stream(self, is_data_preprocess_stream: bool = False) -> None:
        """torch_npu's data-preprocess property changes how its task queue hands this stream's work over; a
        SyncLaunchStream has no task queue, so the property changes nothing here. The argument is checked."""
        if not isinstance(is_data_preprocess_stream, bool):
            raise TypeError("SyncLaunchStream.set_data_preprocess_stream: is_data_preprocess_stream must be a bool, "
                            f"got {type(is_data_preprocess_stream).__name__}")

    @property
    def _as_parameter_(self):
        return ctypes.c_void_p(self.npu_stream)

    def __eq__(self, o) -> bool:
        return isinstance(o, SyncLaunchStream) and torch.Stream.__eq__(self, o)

    __hash__ = _NpuStreamBase.__hash__

    def __repr__(self) -> str:
        return f"<torch_npu.npu.SyncLaunchStream device={self.device} npu_stream={self.stream_id:#x}>"


class Event(torch.Event):
    """An npu event: ``Event(enable_timing=False, blocking=False, interprocess=False)``."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise ValueError("interprocess npu events are not supported (events are host-side markers)")
        return super().__new__(cls, device=torch.device("npu", core.current_device()),
                               enable_timing=enable_timing, blocking=blocking)

    def record(self, stream: torch.Stream | None = None) -> None:
        """Record on ``stream`` (default: the current stream)."""
        stream = current_stream() if stream is None else stream
        super().record(stream)
        if sync_trace.hooks:
            sync_trace.trace("event_record", self.event_id, stream_key(stream))

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Make ``stream`` (default: current) wait for this event."""
        stream = current_stream() if stream is None else stream
        super().wait(stream)
        if sync_trace.hooks:
            sync_trace.trace("event_wait", self.event_id, stream_key(stream))

    def synchronize(self) -> None:
        """Block the host until this event has completed."""
        super().synchronize()
        if sync_trace.hooks:
            sync_trace.trace("event_synchronize", self.event_id)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds from this event to ``end_event`` (both recorded and completed)."""
        if not isinstance(end_event, torch.Event):
            raise ValueError(f"elapsed_time expects an event, got {type(end_event).__name__}")
        return _C._event_elapsed_ms(self.event_id, end_event.event_id)

    def __repr__(self) -> str:
        return f"<torch.npu.Event {self.event_id:#x}>"


def _wrap(device_index: int, stream_id: int) -> Stream | SyncLaunchStream:
    cls = SyncLaunchStream if _SYNC_FIRST <= stream_id < _SYNC_FIRST + _SYNC_COUNT else Stream
    return cls(stream_id=stream_id, device_index=device_index, device_type=_NPU_TYPE)


def graph_capture_stream(device_index: int) -> Stream:
    """``torch.npu.graph``'s default capture stream of a device. Its id is its own, above torch's round-robin pool
    and the sync-launch pool (runtime_c_api.h, NPUDIST_GRAPH_CAPTURE_STREAM): drawn from the pool it would be every
    32nd ``torch.npu.Stream()`` again, whose work would then be captured and whose graph task update refused."""
    return Stream(stream_id=_GRAPH_CAPTURE, device_index=device_index, device_type=_NPU_TYPE)


def current_stream(device: Any = None) -> Stream:
    """The calling thread's current stream on ``device``."""
    idx = core._checked_index(device)
    return _wrap(idx, _C._current_stream(idx))


def default_stream(device: Any = None) -> Stream:
    """The default stream (id 0) of ``device``."""
    return _wrap(core._checked_index(device), 0)


def set_stream(stream: torch.Stream | None) -> None:
    """Make ``stream`` the current stream of its device (None is a no-op, as in torch.cuda)."""
    if stream is None:
        return
    if stream.device_type != _NPU_TYPE:
        raise ValueError(f"set_stream: expected an npu stream, got one on {stream.device}")
    _C._set_stream(stream.device_index, stream.stream_id)


class StreamContext:
    """Context manager selecting a stream and its device (``with torch.npu.stream(s): ...``)."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self._prev_device = -1
        self._prev_streams: tuple | None = None

    def __enter__(self):
        s = self.stream
        if s is None:
            return self
        self._prev_device = core.current_device()
        prev_on_target = _C._current_stream(s.device_index)
        self._prev_streams = (s.device_index, prev_on_target)
        if s.device_index != self._prev_device:
            core.set_device(s.device_index)
        set_stream(s)
        return self

    def __exit__(self, *exc):
        if self.stream is None or self._prev_streams is None:
            return False
        dev, sid = self._prev_streams
        _C._set_stream(dev, sid)
        if self._prev_device != dev:
            core.set_device(self._prev_device)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    """Wrap ``stream`` in a StreamContext."""
    return StreamContext(stream)


_NPU_TYPE = 20  # c10::DeviceType::PrivateUse1, what torch.Stream.device_type reports
# The sync-launch pool's stream ids (runtime_c_api.h).
_SYNC_FIRST, _SYNC_COUNT = _C._SYNC_LAUNCH_STREAM_IDS
_GRAPH_CAPTURE = _C._GRAPH_CAPTURE_STREAM
