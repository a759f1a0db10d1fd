"""torch.npu.memory: statistics and tools of the npu caching allocator (mirrors ``torch.cuda.memory``).

The allocator itself is C++ (``device_core/allocator``); this module is its Python face: the same
function names, arguments and stat keys as ``torch.cuda``, snapshots that PyTorch's memory visualizer
(``torch.cuda._memory_viz``, https://pytorch.org/memory_viz) reads, OOM snapshots
(``OOM_SNAPSHOT_ENABLE``/``OOM_SNAPSHOT_PATH``) and the pluggable-allocator switch. See docs/memory.md.
"""
from __future__ import annotations

import collections
import contextlib
import os
import pickle
import sys
import time
from typing import Any, Callable

import torch

from npudist import _C, env
from npudist.device import host_memory, mem_pool
from npudist.device.device_index import device_index as _device_index
from npudist.device.pluggable_allocator import NPUPluggableAllocator, _NPUAllocator
from npudist.device.host_memory import (
    host_empty_cache,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    reset_accumulated_host_memory_stats,
    reset_peak_host_memory_stats,
)
from npudist.device.host_memory import _host_record_stream  # noqa: F401 (torch.npu.memory._host_record_stream)
from npudist.device.mem_pool import MemPool, use_mem_pool

__all__ = [
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "caching_allocator_disabled",
    "caching_allocator_enable",
    "change_current_allocator",
    "empty_cache",
    "get_allocator_backend",
    "get_per_process_memory_fraction",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "NPUPluggableAllocator",
    "OutOfMemoryError",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
] + host_memory.__all__ + mem_pool.__all__


# Raised when an npu allocation does not fit (torch.cuda.OutOfMemoryError is the same class).
OutOfMemoryError = torch.OutOfMemoryError


def _stream_id(stream: Any, device: int) -> int:
    if stream is None:
        return _C._current_stream(device)
    if isinstance(stream, torch.Stream):
        if stream.device.type != "npu" or stream.device_index != device:
            raise ValueError(f"stream {stream} is not a stream of npu:{device}")
        return stream.stream_id
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    raise TypeError(f"stream must be a torch.npu.Stream, a stream id or None, got {type(stream).__name__}")


# ---- allocation / cache control -------------------------------------------------------------------

def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocate ``size`` bytes from the caching allocator on ``device`` for ``stream``; returns the address.

    Free it with :func:`caching_allocator_delete`. Raises ``torch.OutOfMemoryError`` when the device is full.
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    idx = _device_index(device)
    return _C._npu_cachingAllocator_raw_alloc(size, idx, _stream_id(stream, idx))


def caching_allocator_delete(mem_ptr: int) -> None:
    """Free memory returned by :func:`caching_allocator_alloc` (ValueError for any other address)."""
    _C._npu_cachingAllocator_raw_delete(int(mem_ptr))


def caching_allocator_enable(value: bool = True) -> None:
    """Turn caching on or off at run time (on by default). While off, each allocation gets its own
    segment and every freed segment goes straight back to the device."""
    _C._npu_cachingAllocator_enable(bool(value))


@contextlib.contextmanager
def caching_allocator_disabled():
    """Context manager that disables caching for its body."""
    prev = _C._npu_cachingAllocator_is_enabled()
    caching_allocator_enable(False)
    try:
        yield
    finally:
        caching_allocator_enable(prev)


def empty_cache() -> None:
    """Return every unused cached segment (and unused pages of expandable segments) to the device.

    Memory held by live tensors is not freed; blocks waiting for other streams (``record_stream``) are
    first waited for.
    """
    _C._npu_emptyCache()


def erase_stream(tensor: torch.Tensor, stream: Any) -> None:
    """Undo ``tensor.record_stream(stream)`` (torch_npu.erase_stream).

    Call it only after the tensor's stream waits for ``stream`` (``Event.wait`` / ``wait_stream``): the block then
    returns to the pool at its free without a marker on ``stream``, which record_stream would have kept it out
    for. Without that wait a later allocation may overwrite memory ``stream`` still reads, as on Ascend.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor should be torch.Tensor, could not be {type(tensor)}")
    if not isinstance(stream, torch.npu.Stream):
        raise TypeError(f"stream should be torch.npu.Stream, could not be {type(stream)}")
    _C._npu_eraseStream(tensor=tensor, stream_id=stream.stream_id, device_index=stream.device_index,
                        device_type=stream.device_type)


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Limit this process to ``fraction`` (0..1) of the device capacity; beyond it allocations OOM."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool):
        raise TypeError(f"fraction must be a float, got {type(fraction).__name__}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"Invalid fraction {fraction}: give a value between 0.0 and 1.0")
    _C._npu_setMemoryFraction(float(fraction), _device_index(device))


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction set by :func:`set_per_process_memory_fraction` (1.0 by default)."""
    return _C._npu_getMemoryFraction(_device_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) device memory in bytes; free = capacity minus what this process reserved."""
    return tuple(_C._npu_memGetInfo(_device_index(device)))


def get_allocator_backend() -> str:
    """'native' (the caching allocator) or 'pluggable' (after :func:`change_current_allocator`)."""
    return _C._npu_allocator_backend()


def _set_allocator_settings(env: str) -> None:
    """Apply a PYTORCH_NPU_ALLOC_CONF string at run time (affects later allocations)."""
    _C._npu_set_allocator_settings(env)


# ---- statistics -----------------------------------------------------------------------------------

def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """:func:`memory_stats` as a nested dictionary (``torch.cuda.memory_stats_as_nested_dict`` layout)."""
    return _C._npu_memoryStats(_device_index(device))


def memory_stats(device: Any = None) -> dict[str, Any]:
    """Allocator statistics with the keys of ``torch.cuda.memory_stats``, e.g.
    ``allocated_bytes.all.current``, ``reserved_bytes.large_pool.peak``, ``num_alloc_retries``,
    ``num_ooms``; sorted by key.
    """
    flat: list[tuple[str, Any]] = []

    def visit(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                key = "_".join(map(str, k)) if isinstance(k, tuple) else str(k)
                visit(f"{prefix}.{key}" if prefix else key, v)
        else:
            flat.append((prefix, obj))

    visit("", memory_stats_as_nested_dict(device))
    flat.sort()
    return collections.OrderedDict(flat)


def memory_allocated(device: Any = None) -> int:
    """Bytes currently occupied by tensors on ``device`` (block sizes, i.e. after rounding)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or :func:`reset_peak_memory_stats`."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    """Bytes held by the caching allocator on ``device`` (allocated + cached)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved` since start or :func:`reset_peak_memory_stats`."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def memory_cached(device: Any = None) -> int:
    """Deprecated alias of :func:`memory_reserved` (as in torch.cuda)."""
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated alias of :func:`max_memory_reserved` (as in torch.cuda)."""
    return max_memory_reserved(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Reset every ``peak`` stat to its current value."""
    _C._npu_resetPeakMemoryStats(_device_index(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    """Reset the peak of allocated memory (resets all peaks, as in torch.cuda)."""
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    """Reset the peak of reserved memory (resets all peaks, as in torch.cuda)."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Reset the ``allocated``/``freed`` totals and the event counters (retries, OOMs, ...)."""
    _C._npu_resetAccumulatedMemoryStats(_device_index(device))


def _format_bytes(n: int, ref: int) -> str:
    units = ["B  ", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while i + 1 < len(units) and ref >= 768 * 1024:
        n //= 1024
        ref //= 1024
        i += 1
    return f"{n:6d} {units[i]}"


def _format_count(n: int, ref: int) -> str:
    units = [" ", "K", "M"]
    i = 0
    while i + 1 < len(units) and ref >= 750 * 1000:
        n //= 1000
        ref //= 1000
        i += 1
    return f"{n:7d} {units[i]} "


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """Human-readable table of the allocator statistics (the layout of ``torch.cuda.memory_summary``)."""
    idx = _device_index(device)
    s = memory_stats(idx)
    width = 75
    lines = ["=" * width, f"{'PyTorch NPU memory summary, device ID ' + str(idx):^{width}}", "-" * width,
             f"{'NPU OOMs: ' + str(s['num_ooms']):^37}|{'device alloc retries: ' + str(s['num_alloc_retries']):^37}",
             "=" * width,
             "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    metrics = [("allocated_bytes", "Allocated memory", _format_bytes),
               ("active_bytes", "Active memory", _format_bytes),
               ("requested_bytes", "Requested memory", _format_bytes),
               ("reserved_bytes", "NPU reserved memory", _format_bytes),
               ("inactive_split_bytes", "Non-releasable memory", _format_bytes),
               ("allocation", "Allocations", _format_count),
               ("active", "Active allocs", _format_count),
               ("segment", "NPU reserved segments", _format_count),
               ("inactive_split", "Non-releasable allocs", _format_count)]
    for key, name, fmt in metrics:
        lines.append("-" * width)
        pools = [("all", name)]
        if not abbreviated:
            pools += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        ref = None
        for pool, label in pools:
            vals = [s[f"{key}.{pool}.{m}"] for m in ("current", "peak", "allocated", "freed")]
            ref = ref or vals
            cells = " | ".join(fmt(v, r) for v, r in zip(vals, ref))
            lines.append(f" {label:<21} | {cells} ")
    for key, name in (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize NPU segments")):
        lines.append("-" * width)
        vals = [s[f"{key}.{m}"] for m in ("current", "peak", "allocated", "freed")]
        lines.append(f" {name:<21} | " + " | ".join(_format_count(v, v) for v in vals) + " ")
    lines.append("=" * width)
    return "|" + "|\n|".join(lines) + "|\n"


# ---- snapshots and history ------------------------------------------------------------------------

def _record_memory_history(enabled: str | None = "all", context: str | None = "all", stacks: str = "all",
                           max_entries: int = sys.maxsize, device: Any = None, clear_history: bool = False,
                           skip_actions: list[str] | None = None) -> None:
    """Record stack traces of allocations (and, with ``enabled="all"``, a history of alloc/free events).

    Same arguments as ``torch.cuda.memory._record_memory_history``: ``enabled`` None/"state"/"all",
    ``context`` None/"state"/"alloc"/"all" (which events keep stacks), ``stacks`` "python"/"all" (adds C++
    frames, much slower to symbolize), ``max_entries`` (ring buffer size), ``clear_history``,
    ``skip_actions``. Applies to all npu devices (``device`` is accepted for compatibility).
    """
    if isinstance(enabled, bool):
        enabled = "all" if enabled else None
    if not isinstance(max_entries, int) or max_entries < 0:
        raise ValueError(f"max_entries must be a non-negative int, got {max_entries!r}")
    if device is not None:
        _device_index(device)
    _C._npu_record_memory_history(enabled, context, stacks, min(max_entries, 2**63 - 1), bool(clear_history),
                                  list(skip_actions or []))


def _snapshot(device: Any = None) -> dict[str, Any]:
    """Allocator state in ``torch.cuda.memory._snapshot()`` format: ``segments`` (with ``blocks`` and
    their stack ``frames``), ``device_traces`` (one list of events per device) and ``allocator_settings``.
    """
    return _C._npu_memorySnapshot()


def memory_snapshot(mempool_id: tuple[int, int] | None = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """The ``segments`` of :func:`_snapshot` (as ``torch.cuda.memory_snapshot``); with ``mempool_id`` only
    that private pool's segments. ``include_traces`` is accepted for compatibility (segments carry none).
    """
    segments = _snapshot()["segments"]
    return segments if mempool_id is None else mem_pool.select_pool_segments(segments, mempool_id)


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickle :func:`_snapshot` to ``filename`` (drag it onto https://pytorch.org/memory_viz)."""
    snap = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(snap, f)


def _save_segment_usage(filename: str = "output.svg", snapshot: dict | None = None) -> None:
    from torch.cuda import _memory_viz

    with open(filename, "w") as f:
        f.write(_memory_viz.segment_plot(snapshot if snapshot is not None else _snapshot()))


def _save_memory_usage(filename: str = "output.svg", snapshot: dict | None = None) -> None:
    from torch.cuda import _memory_viz

    with open(filename, "w") as f:
        f.write(_memory_viz.trace_plot(snapshot if snapshot is not None else _snapshot()))


def _attach_out_of_memory_observer(observer: Callable[[int, int, int, int], None]) -> None:
    """Call ``observer(device, alloc_size, device_allocated, device_free)`` before an npu OOM is raised."""
    if not callable(observer):
        raise TypeError("observer must be callable")
    _C._npu_attach_out_of_memory_observer(observer)


def _dump_oom_snapshot(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    directory = env.read("OOM_SNAPSHOT_PATH") or os.getcwd()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"oom_snapshot_{os.getpid()}_{time.strftime('%Y%m%d%H%M%S')}.pickle")
    _dump_snapshot(path)
    sys.stderr.write(f"[npudist] npu:{device} out of memory (tried to allocate {alloc} bytes); "
                     f"memory snapshot written to {path}\n")


def _install_oom_snapshot() -> None:
    """OOM_SNAPSHOT_ENABLE=1: record full history and dump a snapshot on OOM; =2: current state only."""
    mode = env.read("OOM_SNAPSHOT_ENABLE")
    if mode == "0":
        return
    _record_memory_history("all" if mode == "1" else "state", context="all", stacks="python")
    _attach_out_of_memory_observer(_dump_oom_snapshot)


# ---- swapped memory (torch_npu.empty_with_swapped_memory, npudist/device/swapped_memory.py) -------------

def _is_swapped(tensor: torch.Tensor) -> bool:
    """True if ``tensor``'s storage is swapped memory (host memory outside the device budget)."""
    return _C._npu_is_swapped(tensor)


def _swapped_memory_bytes() -> int:
    """Bytes of swapped memory alive in this process (not part of any device's statistics)."""
    return _C._npu_swapped_memory_bytes()


# ---- pluggable allocator --------------------------------------------------------------------------

_current_allocator: _NPUAllocator | None = None


def change_current_allocator(allocator: _NPUAllocator) -> None:
    """Route all later npu allocations to ``allocator``. Only before the first npu allocation."""
    global _current_allocator
    if not isinstance(allocator, NPUPluggableAllocator):
        raise TypeError(f"change_current_allocator expects an NPUPluggableAllocator, got {type(allocator).__name__}")
    _C._npu_change_current_allocator(allocator._alloc_fn, allocator._free_fn)
    _current_allocator = allocator  # keeps the library loaded


def _get_current_allocator() -> _NPUAllocator | None:
    """The pluggable allocator in use, or None for the built-in caching allocator."""
    return _current_allocator


_install_oom_snapshot()
