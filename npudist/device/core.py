"""Devices of torch.npu: count, selection, properties, synchronisation (mirrors torch.cuda)."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from npudist import _C
from npudist.device import sync_trace



def is_available() -> bool:
    """True if this process sees at least one npu device."""
    return _C._device_count() > 0


def device_count() -> int:
    """Visible npu devices (NPUDIST_DEVICE_COUNT, filtered and renumbered by ASCEND_RT_VISIBLE_DEVICES)."""
    return _C._device_count()


def is_initialized() -> bool:
    """True once the device runtime has been used (a device selected or a tensor created)."""
    return _C._is_initialized()


def init() -> None:
    """Initialise the runtime eagerly (it initialises lazily otherwise)."""
    _C._mark_initialized()


def _index(dev: Any, optional: bool = True) -> int:
    """Device index from an int, str, torch.device or None (None -> current device)."""
    if dev is None:
        if optional:
            return current_device()
        raise ValueError("expected an npu device, got None")
    if isinstance(dev, str):
        dev = torch.device(dev)
    if isinstance(dev, torch.device):
        if dev.type != "npu":
            raise ValueError(f"expected an npu device, got {dev}")
        return current_device() if dev.index is None else dev.index
    if isinstance(dev, int) and not isinstance(dev, bool):
        return current_device() if dev < 0 and optional else dev
    raise ValueError(f"expected an npu device (int, str or torch.device), got {dev!r}")


def _checked_index(dev: Any, optional: bool = True) -> int:
    idx = _index(dev, optional)
    n = device_count()
    if not 0 <= idx < n:
        raise ValueError(f"Invalid npu device index {idx}: this process sees {n} npu device(s) "
                         "(set by NPUDIST_DEVICE_COUNT and ASCEND_RT_VISIBLE_DEVICES)")
    return idx


def current_device() -> int:
    """Index of the calling thread's current npu device."""
    return _C._current_device()


def set_device(device: Any) -> None:
    """Select the calling thread's current npu device (a negative index is ignored, as in torch.cuda)."""
    if isinstance(device, int) and not isinstance(device, bool) and device < 0:
        return
    _C._set_device(_checked_index(device))


class device:
    """Context manager that changes the current npu device (``with torch.npu.device(1): ...``)."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.idx >= 0 and self.prev_idx != self.idx:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager selecting the device of a tensor (no-op for non-npu tensors)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "npu" else -1)


def synchronize(device: Any = None) -> None:
    """Wait until all work enqueued on all streams of ``device`` has completed."""
    idx = _checked_index(device)
    _C._synchronize(idx)
    if sync_trace.hooks:
        sync_trace.trace("device_synchronize", idx)


@dataclasses.dataclass(frozen=True)
class NpuDeviceProperties:
    """Properties of an npu device (the fields torch.cuda callers read)."""
    name: str
    total_memory: int
    index: int
    physical_index: int
    major: int = 1
    minor: int = 0
    multi_processor_count: int = 1
    is_integrated: bool = True

    def __repr__(self) -> str:
        return (f"_NpuDeviceProperties(name='{self.name}', total_memory={self.total_memory // (1 << 20)}MB, "
                f"index={self.index}, physical_index={self.physical_index})")


def get_device_properties(device: Any = None) -> NpuDeviceProperties:
    """Name and capacity (NPUDIST_DEVICE_MEMORY) of an npu device."""
    idx = _checked_index(device)
    name, total_memory, physical_index = _C._device_properties(idx)
    return NpuDeviceProperties(name=name, total_memory=total_memory, index=idx, physical_index=physical_index)


def get_device_name(device: Any = None) -> str:
    """Name of an npu device."""
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """(major, minor) of the device model; the emulation reports (1, 0)."""
    p = get_device_properties(device)
    return p.major, p.minor
