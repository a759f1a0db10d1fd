"""Pinned host memory statistics and cache control (mirror ``torch.cuda``'s ``host_*`` functions).

``tensor.pin_memory()``, ``torch.empty(..., pin_memory=True)`` and ``DataLoader(pin_memory=True)`` allocate
from npudist's caching host allocator (``device_core/allocator/host_allocator.cpp``: PyTorch's CachingHostAllocator
over npu streams and events). Freed blocks are cached by power-of-two size and reused once the npu streams
recorded on them have passed the free. See docs/memory.md, "Pinned host memory".
"""
from __future__ import annotations

import collections
from typing import Any

import torch

from npudist import _C

__all__ = [
    "host_empty_cache",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats",
]


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """:func:`host_memory_stats` as a nested dictionary (``torch.cuda.host_memory_stats_as_nested_dict``)."""
    return _C._npu_hostMemoryStats()


def host_memory_stats() -> dict[str, Any]:
    """Pinned host allocator statistics with ``torch.cuda.host_memory_stats()``'s keys, sorted:
    ``allocations``, ``allocated_bytes`` (blocks held, in use or cached), ``active_requests``, ``active_bytes``
    (blocks handed out) as ``.{current,peak,allocated,freed}``; ``num_host_alloc``, ``num_host_free``;
    ``host_alloc_time`` / ``host_free_time`` as ``.{total,max,min,count,avg}`` in microseconds. Sizes are the
    power-of-two block sizes.
    """
    flat: list[tuple[str, Any]] = []

    def visit(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                visit(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat.append((prefix, obj))

    visit("", host_memory_stats_as_nested_dict())
    flat.sort()
    return collections.OrderedDict(flat)


def reset_accumulated_host_memory_stats() -> None:
    """Reset the ``allocated``/``freed`` totals and the timing totals of the host allocator."""
    _C._npu_resetAccumulatedHostMemoryStats()


def reset_peak_host_memory_stats() -> None:
    """Reset every ``peak`` of the host allocator to its current value."""
    _C._npu_resetPeakHostMemoryStats()


def host_empty_cache() -> None:
    """Free every cached pinned block whose streams have passed (in-use blocks stay)."""
    _C._npu_hostEmptyCache()


def _host_record_stream(tensor: torch.Tensor, stream: Any) -> None:
    """Keep the pinned block of ``tensor`` from reuse until ``stream`` has run the work enqueued so far.

    The counterpart of ``Tensor.record_stream`` for pinned CPU tensors (CUDA's copy kernels call the host
    allocator's record_event themselves; npu host<->device copies touch the host bytes before they return,
    so only work the caller enqueues on a stream needs this).
    """
    if not isinstance(stream, torch.Stream) or stream.device.type != "npu":
        raise TypeError(f"stream must be an npu stream, got {stream!r}")
    _C._npu_hostRecordStream(tensor, stream.device_index, stream.stream_id)
