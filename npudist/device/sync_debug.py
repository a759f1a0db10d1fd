"""``torch.npu.set_sync_debug_mode`` / ``get_sync_debug_mode``, as torch.cuda's: "warn" (1) warns and "error" (2)
raises on a synchronizing npu operation, "default" (0) does neither.

Reported synchronizations are the ones torch.cuda reports that go through torch.npu: ``torch.npu.synchronize()``
and ``Stream.synchronize()`` (npudist.device.sync_trace), after they return. A device-to-host copy
(``.item()``, ``.cpu()``) waits for its stream inside the C++ device core, which reports nothing to Python,
so it is not flagged (torch documents that not every synchronizing operation is).
"""
from __future__ import annotations

import warnings

from npudist.device import sync_trace

__all__ = ["set_sync_debug_mode", "get_sync_debug_mode"]

_MODES = {"default": 0, "warn": 1, "error": 2}
_SYNC_KINDS = {"device_synchronize": "torch.npu.synchronize()", "stream_synchronize": "Stream.synchronize()"}
_mode = 0
_remove_hook = None


def _on_sync(kind: str, *args) -> None:
    what = _SYNC_KINDS.get(kind)
    if what is None or _mode == 0:
        return
    message = f"called a synchronizing npu operation: {what}"
    if _mode == 2:
        raise RuntimeError(message + " (torch.npu.set_sync_debug_mode('error'))")
    warnings.warn(message, stacklevel=3)


def set_sync_debug_mode(debug_mode) -> None:
    """``"default"``/0: off; ``"warn"``/1: warn; ``"error"``/2: raise RuntimeError on synchronizing operations."""
    global _mode, _remove_hook
    if isinstance(debug_mode, str):
        if debug_mode not in _MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`, "
                               f"got {debug_mode!r}")
        debug_mode = _MODES[debug_mode]
    if isinstance(debug_mode, bool) or not isinstance(debug_mode, int):
        raise RuntimeError(f"invalid value of debug_mode, expected a str or an int, got {debug_mode!r}")
    # Like torch.cuda: an int beyond "error" errors, below "default" is off.
    _mode = 2 if debug_mode >= 2 else max(debug_mode, 0)
    if _mode and _remove_hook is None:
        _remove_hook = sync_trace.register_trace_hook(_on_sync)
    elif not _mode and _remove_hook is not None:
        _remove_hook()
        _remove_hook = None


def get_sync_debug_mode() -> int:
    """The current mode: 0 (default), 1 (warn) or 2 (error)."""
    return _mode
