"""The npu device index that a ``device`` argument of the torch.npu memory functions names."""
from __future__ import annotations

from typing import Any

import torch

from npudist import _C

__all__ = ["device_index"]


def device_index(device: Any = None) -> int:
    """Index of ``device`` (None/int/str/torch.device); None or an index-less ``npu`` means current."""
    if device is None:
        idx = _C._current_device()
    elif isinstance(device, bool):
        raise ValueError(f"Expected an npu device, got {device!r}")
    elif isinstance(device, int):
        idx = device
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"Expected an npu device (e.g. 'npu:0' or 0), got {device!r}") from e
        if dev.type != "npu":
            raise ValueError(f"Expected an npu device, got {dev} (use torch.cuda/torch.cpu APIs for those)")
        idx = _C._current_device() if dev.index is None else dev.index
    n = _C._device_count()
    if not 0 <= idx < n:
        raise ValueError(f"Invalid npu device index {idx}: this process sees {n} npu device(s) "
                         "(NPUDIST_DEVICE_COUNT / ASCEND_RT_VISIBLE_DEVICES)")
    return idx
