"""Operator data dump: ``torch.npu.init_dump()`` / ``set_dump(cfg_file)`` / ``finalize_dump()``.

torch_npu's names call ACL's ``aclmdlInitDump`` / ``aclmdlSetDump`` / ``aclmdlFinalizeDump``: after them the
inputs and/or outputs of the npu ops a CANN dump configuration selects are written under its ``dump_path``.
Here a ``TorchDispatchMode`` (entered on the thread that calls ``set_dump``, as the stream sanitizer's) sees
every op on npu tensors and writes the selected tensors, as ``.npy`` files or as rows of statistics, in
CANN's directory and file naming. docs/debugging.md, "Operator data dump", lists the format differences.

Dumping an op copies its tensors to the host, which waits for the op's kernel (and the stream's queued
work before it): a dumped op is synchronous.
"""
from __future__ import annotations

import csv
import itertools
import math
import os
import threading
import time
from dataclasses import dataclass

import numpy
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, _get_current_dispatch_mode

from npudist import _C
from npudist.device import core
from npudist.device.npu_leaves import NO_DATA, npu_tensors
from npudist.device.op_dump_config import DumpConfig, op_aliases, read_config

__all__ = ["init_dump", "set_dump", "finalize_dump"]

# Ops that launch no operator on the device: allocation without initialisation, allocator bookkeeping,
# host<->device transfers (memcpy tasks, which CANN's dump does not record either) and scalar reads.
_NOT_OPERATORS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
                            "record_stream", "set_", "resize_", "_local_scalar_dense"})
_TRANSFERS = frozenset({"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize"})
# hccl collectives run on the group's comm stream and their outputs are final only at Work.wait() /
# wait_tensor, not when the op returns: copying them here would dump unfinished data.
_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional"})

# CANN's data type names (aclDataType / GE's DT_*), as its dump tools print them.
_DT = {torch.float32: "DT_FLOAT", torch.float16: "DT_FLOAT16", torch.bfloat16: "DT_BF16",
       torch.float64: "DT_DOUBLE", torch.int8: "DT_INT8", torch.uint8: "DT_UINT8", torch.int16: "DT_INT16",
       torch.uint16: "DT_UINT16", torch.int32: "DT_INT32", torch.uint32: "DT_UINT32", torch.int64: "DT_INT64",
       torch.uint64: "DT_UINT64", torch.bool: "DT_BOOL", torch.complex64: "DT_COMPLEX64",
       torch.complex128: "DT_COMPLEX128", torch.complex32: "DT_COMPLEX32",
       torch.float8_e5m2: "DT_FLOAT8_E5M2", torch.float8_e4m3fn: "DT_FLOAT8_E4M3FN"}

STATS_COLUMNS = ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "Input/Output", "Slot", "Data Size",
                 "Data Type", "Format", "Shape", "Max Value", "Min Value", "Avg Value", "Count", "Nan Count",
                 "Negative Inf Count", "Positive Inf Count"]
INDEX_COLUMNS = ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "Input/Output", "Slot", "Data Type",
                 "Shape", "File"]
STATS_FILE = "statistic.csv"
INDEX_FILE = "tensor_index.csv"


@dataclass
class _Op:
    """One dumped op execution: the fields of CANN's dump file name."""
    op_type: str
    op_name: str
    task_id: int
    stream_id: int
    timestamp: int
    device: int

    def file_stem(self) -> str:
        return f"{self.op_type}.{self.op_name}.{self.task_id}.{self.stream_id}.{self.timestamp}"


def _names(func) -> tuple[str, str, set[str]]:
    """(op_type, op_name, names a dump_list layer may use for it). The file name's fields are separated by
    dots, so the qualified overload ``aten.add.Tensor`` becomes the op name ``aten_add_Tensor``."""
    ns, name = func.namespace, func._schema.name.split("::")[-1]
    overload = func._overloadname or "default"
    return name, f"{ns}_{name}_{overload}", op_aliases(ns, name, overload)


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _is_operator(func, op_type: str, args, kwargs) -> bool:
    """Whether the op launches an operator on the device (what a dump records), from its name and schema."""
    if op_type in _NOT_OPERATORS or func.namespace in _COLLECTIVE_NAMESPACES or _is_view(func):
        return False
    return not (op_type in _TRANSFERS and _has_host_tensor(args, kwargs))


def _has_host_tensor(*values) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in pytree.tree_leaves(values))


def _arguments(func, args, kwargs) -> list:
    """(schema argument, value) pairs of a call, in schema order."""
    by_name = {a.name: a for a in func._schema.arguments}
    return list(zip(func._schema.arguments, args)) + [(by_name[k], v) for k, v in kwargs.items() if k in by_name]


def _inputs(func, args, kwargs) -> list[torch.Tensor]:
    """The npu tensors an op reads, in schema order (``out=`` arguments are outputs, not inputs)."""
    return [t for arg, value in _arguments(func, args, kwargs) if not arg.is_out for t in npu_tensors(value)]


def _outputs(func, args, kwargs, out) -> list[torch.Tensor]:
    """The npu tensors an op writes: its results, or, for an in-place op that returns nothing
    (``_foreach_mul_``), the arguments it writes."""
    if func._schema.returns:
        return npu_tensors(out)
    return [t for arg, value in _arguments(func, args, kwargs)
            if arg.alias_info is not None and arg.alias_info.is_write for t in npu_tensors(value)]


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """The tensor's final values on the host: the blocking copy waits for the kernels that write it."""
    with _disable_current_modes(), torch.no_grad():
        return t.detach().to("cpu").contiguous()


def _to_numpy(t: torch.Tensor) -> numpy.ndarray:
    """numpy has no bfloat16 / float8 / complex32: those are widened (float32, complex64); the index keeps
    the original data type."""
    if t.dtype in (torch.bfloat16, torch.float8_e5m2, torch.float8_e4m3fn):
        t = t.to(torch.float32)
    elif t.dtype == torch.complex32:
        t = t.to(torch.complex64)
    return t.numpy()


def _shape(t: torch.Tensor) -> str:
    return "[" + ",".join(str(s) for s in t.shape) + "]"


def _statistics(t: torch.Tensor) -> list:
    """Max, Min and Avg of the finite values (``nan`` when there are none), the element count and the NaN,
    -inf and +inf counts. Complex tensors: of the magnitudes."""
    if t.is_complex():
        t = t.abs()
    v = t.to(torch.float64) if t.dtype != torch.float64 else t
    count = v.numel()
    nan = int(torch.isnan(v).sum())
    neg_inf = int(torch.isneginf(v).sum())
    pos_inf = int(torch.isposinf(v).sum())
    finite = v[torch.isfinite(v)]
    if finite.numel():
        values = [float(finite.max()), float(finite.min()), float(finite.mean())]
    else:
        values = [math.nan] * 3
    return [repr(x) for x in values] + [count, nan, neg_inf, pos_inf]


class _Writer:
    """Writes one dump session's files: ``{dump_path}/{YYYYMMDDhhmmss}/{device_id}/...``."""

    def __init__(self, config: DumpConfig) -> None:
        self.config = config
        self.root = os.path.join(config.path, time.strftime("%Y%m%d%H%M%S"))
        self.tables: dict[int, tuple] = {}   # device -> (csv file, its writer, the device's directory)

    def table(self, device: int):
        entry = self.tables.get(device)
        if entry is None:
            directory = os.path.join(self.root, str(device))
            os.makedirs(directory, exist_ok=True)
            stats = self.config.dump_data == "stats"
            f = open(os.path.join(directory, STATS_FILE if stats else INDEX_FILE), "a", newline="",
                     encoding="utf-8")
            writer = csv.writer(f)
            if f.tell() == 0:
                writer.writerow(STATS_COLUMNS if stats else INDEX_COLUMNS)
            entry = self.tables[device] = (f, writer, directory)
        return entry

    def write(self, op: _Op, kind: str, tensors: list[torch.Tensor]) -> None:
        """``tensors``: host copies of the op's inputs or outputs (``kind``), in slot order."""
        f, writer, directory = self.table(op.device)
        head = [op.op_type, op.op_name, op.task_id, op.stream_id, op.timestamp, kind]
        for slot, t in enumerate(tensors):
            dtype = _DT.get(t.dtype, str(t.dtype))
            if self.config.dump_data == "stats":
                writer.writerow(head + [slot, t.numel() * t.element_size(), dtype, "ND", _shape(t)] +
                                _statistics(t))
            else:
                name = f"{op.file_stem()}.{kind}.{slot}.npy"
                numpy.save(os.path.join(directory, name), _to_numpy(t), allow_pickle=False)
                writer.writerow(head + [slot, dtype, _shape(t), name])
        f.flush()

    def close(self) -> None:
        for f, _, _ in self.tables.values():
            f.close()
        self.tables.clear()


class OpDumpMode(TorchDispatchMode):
    """The dispatch mode that writes the selected npu ops' tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()   # the autograd engine runs backward ops on its own threads
        self.writer: _Writer | None = None
        self.task_ids = itertools.count()
        self.last_timestamp = 0

    @staticmethod
    def selects(writer: _Writer, names: set[str]) -> bool:
        layers = writer.config.layers
        return layers is None or not layers.isdisjoint(names)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, NO_DATA) for t in types):
            return func(*args, **kwargs)   # shape propagation (DTensor sharding, compile tracing): no data
        if any(t is not torch.Tensor and hasattr(t, "__tensor_flatten__") for t in types):
            return NotImplemented   # a tensor subclass runs the op; its inner tensors' ops come back here
        op_type, op_name, names = _names(func)
        writer = self.writer
        if writer is None or not self.selects(writer, names) or not _is_operator(func, op_type, args, kwargs):
            return func(*args, **kwargs)
        config = writer.config
        inputs = _inputs(func, args, kwargs)
        # Inputs are read before the op runs: an in-place op overwrites them (CANN dumps inputs before the op).
        before = [_host_copy(t) for t in inputs] if config.inputs else []
        out = func(*args, **kwargs)
        outputs = _outputs(func, args, kwargs, out)
        if not inputs and not outputs:
            return out   # the op touches no npu memory
        after = [_host_copy(t) for t in outputs] if config.outputs else []
        device = (inputs or outputs)[0].device.index or 0
        with self.lock:
            # CANN's 16-digit microsecond timestamp, kept increasing so files sort in execution order.
            stamp = self.last_timestamp = max(time.time_ns() // 1000, self.last_timestamp + 1)
            op = _Op(op_type, op_name, next(self.task_ids), _C._current_stream(device), stamp, device)
            if config.inputs:
                writer.write(op, "input", before)
            if config.outputs:
                writer.write(op, "output", after)
        return out


class _State:
    """ACL's dump state for this process: initialised by init_dump, configured by set_dump."""

    def __init__(self) -> None:
        self.initialized = False
        self.mode: OpDumpMode | None = None
        self.thread: int | None = None


_state = _State()
_state_lock = threading.Lock()


def init_dump() -> None:
    """Start the dump machinery (``aclmdlInitDump``); :func:`set_dump` then chooses what is dumped."""
    core.init()
    with _state_lock:
        if _state.initialized:
            raise RuntimeError("torch.npu.init_dump: the dump is already initialised; call "
                               "torch.npu.finalize_dump() before initialising it again")
        _state.initialized = True


def set_dump(cfg_file) -> None:
    """Dump the npu ops that the CANN dump configuration ``cfg_file`` selects (``aclmdlSetDump``), from now
    until :func:`finalize_dump`, on this thread (and the autograd threads its backward passes use). A second
    call replaces the configuration (CANN's override rule); each call starts a new time-stamped directory."""
    core.init()
    with _state_lock:
        if not _state.initialized:
            raise RuntimeError("torch.npu.set_dump: the dump is not initialised; call torch.npu.init_dump() "
                               "first (ACL requires aclmdlInitDump before aclmdlSetDump)")
        config = read_config(cfg_file)
        mode = _state.mode
        if mode is not None and _state.thread != threading.get_ident():
            raise RuntimeError("torch.npu.set_dump: the dump is active on another thread; call set_dump on the "
                               "thread that called it first, or finalize_dump() there first")
        if mode is None:
            mode = OpDumpMode()
            mode.__enter__()
            _state.mode, _state.thread = mode, threading.get_ident()
        with mode.lock:
            if mode.writer is not None:
                mode.writer.close()
            mode.writer = _Writer(config)


def finalize_dump() -> None:
    """Stop dumping and close the dump's files (``aclmdlFinalizeDump``); init_dump may be called again."""
    core.init()
    with _state_lock:
        if not _state.initialized:
            raise RuntimeError("torch.npu.finalize_dump: the dump is not initialised; call "
                               "torch.npu.init_dump() first")
        mode = _state.mode
        if mode is not None:
            if _state.thread != threading.get_ident():
                raise RuntimeError("torch.npu.finalize_dump: call it on the thread that called set_dump (the "
                                   "dump's dispatch mode is entered on that thread)")
            if _get_current_dispatch_mode() is not mode:
                raise RuntimeError("torch.npu.finalize_dump: a dispatch mode entered after set_dump is still "
                                   "active; exit it before finalize_dump")
            mode.__exit__(None, None, None)
            with mode.lock:
                mode.writer.close()
                mode.writer = None
        _state.initialized, _state.mode, _state.thread = False, None, None


def is_dumping() -> bool:
    """True between set_dump and finalize_dump."""
    return _state.mode is not None

