"""``torch_npu.utils.save_async``: ``torch.save`` whose device-to-host copy and file write leave the training
loop (checkpointing every N steps without stalling the step)."""
from __future__ import annotations

import pickle
import threading

import torch
from torch.serialization import DEFAULT_PROTOCOL
from torch.utils._pytree import tree_map

_streams: dict[int, "torch.npu.Stream"] = {}


def save_async(obj: object, f, pickle_module=pickle, pickle_protocol: int = DEFAULT_PROTOCOL,
               _use_new_zipfile_serialization: bool = True, _disable_byteorder_record: bool = False,
               model: torch.nn.Module = None) -> None:
    """Saves ``obj`` to ``f`` as ``torch.save`` would at the moment of the call, without waiting.

    Every npu tensor in ``obj`` (nested lists, tuples, dicts) is copied to pinned host memory on a side stream
    that first waits for the current stream, and the current stream then waits for those copies: later in-place
    updates (the optimizer's step) cannot overtake them, and the host is not blocked. A background thread waits
    for the copies and writes the file with ``torch.save``; the file is complete when that thread ends (a
    non-daemon thread: the interpreter waits for it at exit). ``model`` is accepted for torch_npu's signature:
    the ordering above already covers its parameters."""
    if not _use_new_zipfile_serialization:
        raise RuntimeError("save_async: _use_new_zipfile_serialization=False is not supported for npu tensors; "
                           "keep the zipfile format, or move the tensors to cpu and call torch.save")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"save_async: model must be an nn.Module or None, got {type(model).__name__}")
    current = torch.npu.current_stream()
    side = _streams.get(current.device_index)
    if side is None:    # one side stream per device, made on first use
        side = _streams[current.device_index] = torch.npu.Stream(current.device_index)
    side.wait_stream(current)
    with torch.npu.stream(side):
        host = tree_map(lambda t: _to_host(t, side), obj)
    copied = torch.npu.Event()
    copied.record(side)
    current.wait_stream(side)

    def write():
        copied.synchronize()
        torch.save(host, f, pickle_module=pickle_module, pickle_protocol=pickle_protocol,
                   _disable_byteorder_record=_disable_byteorder_record)

    threading.Thread(target=write, name="torch_npu.save_async").start()


def _to_host(t, stream):
    if not isinstance(t, torch.Tensor) or t.device.type != "npu":
        return t
    t.record_stream(stream)     # the copy runs on the side stream: the block stays allocated until it ran
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)
