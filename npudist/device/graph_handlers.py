"""torch_npu's NPUGraph operator handlers: the registry behind ``torch.npu.graph(g, auto_dispatch_capture=True)``.

With ``auto_dispatch_capture``, a dispatch mode active during the capture puts every call of an operator that has a
registered handler in its own task group (graph_task_update.py), preceded by an ExternalEvent wait and reset, and
keeps a record of the call. :meth:`NPUGraph.update` then re-issues each recorded call on an update stream with the
arguments the caller gives (``[{"actual_seq_lengths": [100]}]``, one dict per recorded call or one for all),
updates its task group and records its event, so the next replay runs after the update with the new arguments.

A handler is a class with class-method hooks (:class:`NpuGraphOpHandler`), registered for operator overload names
(``func.__name__``, e.g. ``"npu_fused_infer_attention_score.default"``) with :func:`register_npu_graph_handler`.
``UPDATE_SPECS`` says where each update key goes: ``{op_name: [("arg", index, key) | ("kwarg", name, key)]}``.
"""
from __future__ import annotations

import logging
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from npudist.device import streams
from npudist.device.graph_task_update import (
    ExternalEvent,
    graph_task_group_begin,
    graph_task_group_end,
    graph_task_update_begin,
    graph_task_update_end,
)

logger = logging.getLogger(__name__)


class NpuGraphOpHandler:
    """Base class of an operator's capture / update hooks; every hook is a classmethod (handlers are stateless)."""

    UPDATE_SPECS: dict = {}

    @classmethod
    def prepare_capture(cls, func, args, kwargs):
        """Before the call is recorded: returns ``(actual_func, args, kwargs)`` to run (default: unchanged)."""
        return func, args, kwargs

    @classmethod
    def postprocess_result(cls, result, kwargs):
        """The value the captured call returns to its caller (default: the op's result)."""
        return result

    @classmethod
    def get_update_specs(cls, op_name):
        """``UPDATE_SPECS[op_name]``: ``[(loc, index_or_name, key)]``, empty for an op without specs."""
        return cls.UPDATE_SPECS.get(op_name, [])

    @classmethod
    def update_args(cls, dispatch_record, update_input):
        """Put each ``update_input`` value where ``UPDATE_SPECS`` says (a positional index or a keyword name)."""
        for loc, where, key in cls.get_update_specs(dispatch_record.op_cache_entry.__name__):
            if key not in update_input:
                continue
            if loc == "arg":
                if where < len(dispatch_record.args):
                    dispatch_record.args[where] = update_input[key]
            elif loc == "kwarg":
                dispatch_record.kwargs[where] = update_input[key]
            else:
                raise ValueError(f"{cls.__name__}.UPDATE_SPECS: location must be 'arg' or 'kwarg', got {loc!r}")

    @classmethod
    def record_wrap_kwarg(cls, key, value, tensor_param_names):
        """How a keyword argument is kept in the record: tensors as they are (the graph keeps their memory),
        other values copied, so later changes by the caller do not reach the update."""
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return type(value)(v if torch.is_tensor(v) else deepcopy(v) for v in value)
        return value if torch.is_tensor(value) else deepcopy(value)


_NPU_GRAPH_OP_HANDLERS: dict[str, type] = {}


def register_npu_graph_handler(op_names):
    """Class decorator registering a handler class for ``op_names`` (a name or a list of overload names)."""
    names = [op_names] if isinstance(op_names, str) else list(op_names)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"register_npu_graph_handler: op_names must be a name or a list of names, got {op_names!r}")

    def decorator(cls):
        if not (isinstance(cls, type) and issubclass(cls, NpuGraphOpHandler)):
            raise ValueError(f"register_npu_graph_handler: {cls!r} must be a subclass of NpuGraphOpHandler")
        for name in names:
            if name in _NPU_GRAPH_OP_HANDLERS:
                logger.warning("NpuGraphOpHandler for '%s' is being overridden: %s -> %s", name,
                               _NPU_GRAPH_OP_HANDLERS[name].__name__, cls.__name__)
            _NPU_GRAPH_OP_HANDLERS[name] = cls
        return cls

    return decorator


@dataclass
class _GraphDispatchRecord:
    """One handled call recorded during capture: its event, task group, arguments and operator."""
    event: Any = None
    handle: Any = None
    kwargs: dict = field(default_factory=dict)
    args: list = field(default_factory=list)
    op_cache_entry: Any = None


def _composite(func) -> bool:
    """Whether ``func`` (an op overload or packet) decomposes above the Python dispatch key (CompositeImplicit):
    a dispatch mode never sees such an op, only its parts; npudist's fused npu operators are such compositions."""
    overload = getattr(func, "default", func)
    schema = getattr(overload, "_schema", None)
    return schema is not None and torch._C._dispatch_has_kernel_for_dispatch_key(schema.name,
                                                                                "CompositeImplicitAutograd")


class _CompositeOpMode(TorchFunctionMode):
    """The handled operators that decompose before dispatch are caught at the call (torch.ops.* calls reach
    function modes); the rest are caught by _GraphDispatchMode below."""

    def __init__(self, owner: "_GraphDispatchMode"):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) and \
                func.__name__ in _NPU_GRAPH_OP_HANDLERS and _composite(func):
            return self.owner._handle(func, args, kwargs)
        return func(*args, **(kwargs or {}))


class _GraphDispatchMode(TorchDispatchMode):
    """Active during an ``auto_dispatch_capture`` capture: task groups around the handled operators' calls."""

    def __init__(self):
        super().__init__()
        self.graph_dispatch_records: list[_GraphDispatchRecord] = []
        self.update_stream = None
        self._function_mode = _CompositeOpMode(self)
        self._in_group = False

    def __enter__(self):
        self._function_mode.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._function_mode.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb):
        try:
            return super().__exit__(exc_type, exc, tb)
        finally:
            self._function_mode.__exit__(exc_type, exc, tb)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._in_group:  # the parts of a handled composite op belong to its group
            return func(*args, **(kwargs or {}))
        return self._handle(func, args, kwargs)

    def _handle(self, func, args, kwargs):
        kwargs = dict(kwargs or {})
        handler = _NPU_GRAPH_OP_HANDLERS.get(func.__name__)
        if handler is None or (hasattr(handler, "should_handle") and not handler.should_handle(func, args, kwargs)):
            return func(*args, **kwargs)
        stream = streams.current_stream()
        event = ExternalEvent()
        event.wait(stream)   # each replay waits for the update of this call ...
        event.reset(stream)  # ... and leaves the event clear for the next one
        actual, args, kwargs = handler.prepare_capture(func, args, kwargs)
        graph_task_group_begin(stream)
        self._in_group = True
        try:
            result = actual(*args, **kwargs)
        finally:
            self._in_group = False
        handle = graph_task_group_end(stream)
        schema = getattr(getattr(actual, "default", actual), "_schema", None)
        tensor_names = [a.name for a in schema.arguments if isinstance(a.type, torch.TensorType)] if schema else []
        self.graph_dispatch_records.append(_GraphDispatchRecord(
            event=event, handle=handle, op_cache_entry=actual,
            args=[a if torch.is_tensor(a) else deepcopy(a) for a in args],
            kwargs={k: handler.record_wrap_kwarg(k, v, tensor_names) for k, v in kwargs.items()}))
        return handler.postprocess_result(result, kwargs)

    def update_capture_record(self, cpu_update_input):
        records = self.graph_dispatch_records
        if not isinstance(cpu_update_input, (list, tuple)) or not all(isinstance(u, dict) for u in cpu_update_input):
            raise ValueError("NPUGraph.update: cpu_update_input must be a list of dicts (one per handled call "
                             f"recorded in the capture, or one for all), got {cpu_update_input!r}")
        if not records:
            raise ValueError("NPUGraph.update: the capture recorded no call of an operator with a registered "
                             "handler (torch.npu.register_npu_graph_handler), so there is nothing to update")
        if len(cpu_update_input) == 1:
            cpu_update_input = [dict(cpu_update_input[0]) for _ in records]
        if len(cpu_update_input) != len(records):
            raise ValueError(f"NPUGraph.update: the capture recorded {len(records)} handled operator calls but "
                             f"cpu_update_input has {len(cpu_update_input)} entries; pass one dict per call, or one "
                             "for all")
        if self.update_stream is None:
            self.update_stream = streams.Stream()
        with streams.stream(self.update_stream):
            for record, update in zip(records, cpu_update_input):
                handler = _NPU_GRAPH_OP_HANDLERS.get(record.op_cache_entry.__name__)
                if handler is None:
                    raise RuntimeError(f"NPUGraph.update: no handler is registered for the recorded operator "
                                       f"{record.op_cache_entry.__name__} any more; register it again before update")
                for key, value in update.items():
                    if key in record.kwargs:
                        record.kwargs[key] = value
                handler.update_args(record, update)
                graph_task_update_begin(self.update_stream, record.handle)
                try:
                    record.op_cache_entry(*record.args, **record.kwargs)
                finally:
                    graph_task_update_end(self.update_stream)
                record.event.record(self.update_stream)


@register_npu_graph_handler(["npu_fused_infer_attention_score", "npu_fused_infer_attention_score.default"])
class _IFAv1Handler(NpuGraphOpHandler):
    """npu_fused_infer_attention_score: the valid lengths are host lists, updated in place of the captured ones.
    (torch_npu swaps to an .out overload with a sized AI-core workspace; here the op allocates its results and the
    update writes where the captured results live, graph_task_update.md.)"""

    UPDATE_SPECS = {name: [("kwarg", "actual_seq_lengths", "actual_seq_lengths"),
                           ("kwarg", "actual_seq_lengths_kv", "actual_seq_lengths_kv")]
                    for name in ("npu_fused_infer_attention_score", "npu_fused_infer_attention_score.default")}


@register_npu_graph_handler(["npu_fused_infer_attention_score_v2", "npu_fused_infer_attention_score_v2.default"])
class _IFAv2Handler(NpuGraphOpHandler):
    """npu_fused_infer_attention_score_v2: ``actual_seq_qlen`` / ``actual_seq_kvlen`` updated."""

    UPDATE_SPECS = {name: [("kwarg", "actual_seq_qlen", "actual_seq_qlen"),
                           ("kwarg", "actual_seq_kvlen", "actual_seq_kvlen")]
                    for name in ("npu_fused_infer_attention_score_v2", "npu_fused_infer_attention_score_v2.default")}


__all__ = ["NpuGraphOpHandler", "register_npu_graph_handler"]
