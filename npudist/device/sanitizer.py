"""The npu stream sanitizer: reports tensor accesses on different streams that are not ordered.

Enable with ``NPUDIST_STREAM_SANITIZER=1`` (at ``import npudist`` / ``import torch``) or
:func:`enable` (``torch.npu._sanitizer.enable_npu_sanitizer()``). Modelled on PyTorch's CUDA sanitizer
(``torch.cuda._sanitizer``): a ``TorchDispatchMode`` sees every op, classifies each npu tensor argument as
read or written from the schema's alias info, and keeps per storage the last write and the reads since, each
with its stream and that stream's logical clock. Streams order through events, ``wait_stream``,
synchronize (vector clocks, reported by the trace hooks of :mod:`npudist.device.sync_trace`) and hccl
collectives (issued on the group's comm stream after the current stream; ``Work.wait()`` / ``wait_tensor``
order the waiting stream after it). An access not ordered after a conflicting access of another stream raises
:class:`StreamSanitizerError` naming the tensor, both streams and both Python stacks.

Frees are checked too (the allocator's deallocation hook, :func:`npudist.device.sync_trace.register_free_hook`):
a block freed by the host goes back to the pool of the stream it was allocated on, whose later allocations may
get it at once. A free is remembered when another stream accessed the storage and that access is neither covered
by ``tensor.record_stream(that stream)`` made after it nor ordered before the allocation stream's position
(``wait_stream``, an event, a synchronize); an op that then allocates from the same pool on that stream before
the stream is ordered after the access raises :class:`UnsynchronizedFreeError` (FSDP2 frees such blocks and
orders the stream before its next allocation there: no report).

Ordering is logical, not timed: the emulator may run everything in order today; the report says the program
would race on a device that overlaps streams. See docs/debugging.md for what is and is not modelled.

torch's CSAN classes are not reused: importing ``torch.cuda._sanitizer`` activates CUDA's gpu trace and
registers its callbacks as a side effect, its argument handler only sees ``is_cuda`` tensors, it keys by tensor
data pointer (a view at an offset escapes it), and its report has no shape/dtype.
"""
from __future__ import annotations

import collections
import inspect
import re
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from npudist import _C
from npudist.device import sync_trace
from npudist.device.npu_leaves import NO_DATA, npu_tensors

StreamKey = Any   # (device_index, stream_id) for npu streams, ("comm", group) for an hccl group's comm stream
Clock = dict      # StreamKey -> the last sequence number of that stream this state is ordered after

_SMALL_SIZE = 1 << 20   # allocations up to 1 MiB come from the small pool (device_core/allocator/alloc_config.h)

# Factories taking a tensor read only its metadata (CSAN's rule).
_FACTORY = re.compile(r"(new_.*|.*_like)")
_FUNCTIONAL_NS = "_c10d_functional"


@dataclass
class Access:
    """One read or write of a storage by an op."""
    is_write: bool
    seq: int
    stream: StreamKey
    op: str
    args: list[str]
    tensor: tuple   # (shape, dtype, data_ptr), formatted only for a report
    stack: traceback.StackSummary


class UnsynchronizedAccessError(Exception):
    """Two accesses to one storage on different streams, at least one a write, with no ordering between them."""

    def __init__(self, storage_ptr: int, current: Access, previous: Access):
        super().__init__(storage_ptr, current, previous)
        self.storage_ptr, self.current, self.previous = storage_ptr, current, previous

    def __str__(self) -> str:
        def describe(a: Access) -> str:
            what = "writing" if a.is_write else "reading"
            args = f" (argument {', '.join(a.args)})" if a.args else ""
            return (f"{what} {_format_tensor(a.tensor)}{args} in {a.op} on {_stream_name(a.stream)}\n"
                    f"with stack trace:\n{''.join(a.stack.format())}")
        return (f"npu stream sanitizer: unsynchronized access to storage {self.storage_ptr:#x}\n"
                f"Current access: {describe(self.current)}\n"
                f"Previous access, not ordered before it: {describe(self.previous)}\n"
                "Fix: order the two streams (stream.wait_stream(other), an event record/wait, a synchronize, "
                "or Work.wait() / wait_tensor for a collective) before the current access.")


@dataclass
class _Freed:
    """A block freed into its allocation stream's pool while accesses of other streams were not ordered before."""
    ptr: int
    small: bool   # the pool it returned to (a block serves allocations of its pool only)
    owner: StreamKey
    stack: traceback.StackSummary
    accesses: list[Access]


class UnsynchronizedFreeError(Exception):
    """The host freed a storage another stream's access is not ordered before, and its allocation stream then
    allocated from that pool (``reuse``, which may get the block) while that access may still be to run."""

    def __init__(self, freed: _Freed, previous: Access, reuse: Access):
        super().__init__(freed, previous, reuse)
        self.storage_ptr, self.owner, self.stack = freed.ptr, freed.owner, freed.stack
        self.previous, self.reuse = previous, reuse

    def __str__(self) -> str:
        a, other, r = self.previous, _stream_name(self.previous.stream), self.reuse
        what = "writing" if a.is_write else "reading"
        args = f" (argument {', '.join(a.args)})" if a.args else ""
        return (f"npu stream sanitizer: storage {self.storage_ptr:#x} freed while another stream may still access it\n"
                f"Free: {_format_tensor(a.tensor)} freed by the host into the pool of {_stream_name(self.owner)}, "
                f"with stack trace:\n{''.join(self.stack.format())}"
                f"Access not ordered before the free: {what} it{args} in {a.op} on {other}\n"
                f"with stack trace:\n{''.join(a.stack.format())}"
                f"Reuse: {r.op} allocates {_format_tensor(r.tensor)} on {_stream_name(self.owner)}, which may get the "
                f"freed block, with stack trace:\n{''.join(r.stack.format())}"
                f"Fix: call tensor.record_stream({other}) after its use there (the allocator then keeps the block "
                "until that stream passed that point), or order the allocation stream after that use "
                "(wait_stream, an event record/wait, a synchronize) before it allocates again.")


class StreamSanitizerError(RuntimeError):
    """Raised after an op whose accesses race or that may reuse a block freed unordered; ``errors`` lists each
    :class:`UnsynchronizedAccessError` / :class:`UnsynchronizedFreeError`."""

    def __init__(self, errors: list):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


def _stream_name(key: StreamKey) -> str:
    if key[0] == "comm":
        return f"hccl comm stream of group {key[1]!r}"
    return f"npu:{key[0]} stream {key[1]:#x}" + (" (default stream)" if key[1] == 0 else "")


# Frames of the dispatch-mode machinery, left out of reports.
_INTERNAL_FILES = (__file__, sync_trace.__file__, "torch/_compile.py", "torch/_dynamo/eval_frame.py")


def _stack() -> traceback.StackSummary:
    frames = [(f, lineno) for f, lineno in traceback.walk_stack(inspect.currentframe())
              if not f.f_code.co_filename.endswith(_INTERNAL_FILES)]
    stack = traceback.StackSummary.extract(reversed(frames), lookup_lines=False)
    return stack


def _join(into: Clock, other: Clock) -> None:
    for k, v in other.items():
        if into.get(k, -1) < v:
            into[k] = v


class _Clocks:
    """Vector clocks of streams, recorded events and the host (CSAN's StreamSynchronizations)."""

    def __init__(self) -> None:
        self.streams: dict[StreamKey, Clock] = {}
        self.events: dict[int, Clock] = {}
        self.host: Clock = {}

    def of(self, stream: StreamKey) -> Clock:
        clock = self.streams.get(stream)
        if clock is None:   # a stream starts ordered after everything the host has waited for
            clock = self.streams[stream] = dict(self.host)
            clock.setdefault(stream, 0)
            self.host.setdefault(stream, 0)
        return clock

    def tick(self, stream: StreamKey, seq: int) -> None:
        self.of(stream)[stream] = seq

    def record(self, event: int, stream: StreamKey) -> None:
        self.events[event] = dict(self.of(stream))

    def wait(self, stream: StreamKey, state: Clock) -> None:
        _join(self.of(stream), state)

    def host_waits(self, state: Clock) -> None:
        """The host has seen ``state`` complete: every stream's later work is ordered after it."""
        _join(self.host, state)
        for clock in self.streams.values():
            _join(clock, state)

    def ordered_after(self, stream: StreamKey, seq: int, other: StreamKey) -> bool:
        return seq <= self.of(stream).get(other, -1)


@dataclass
class _StorageRecord:
    device: int
    nbytes: int
    write: Access | None = None
    reads: list[Access] = field(default_factory=list)
    recorded: Clock = field(default_factory=dict)   # what record_stream made the allocator wait for


class _Tracker:
    """Accesses per storage and the synchronization state; thread-safe (autograd runs backward on its own thread)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.clocks = _Clocks()
        self.storages: dict[int, _StorageRecord] = {}
        self.pending: dict[int, Clock] = {}   # storage of a functional collective's output -> completion state
        self.collectives: collections.Counter[str] = collections.Counter()   # op -> times seen on a comm stream
        self.seq = 0
        self.freed: dict[StreamKey, list[_Freed]] = {}   # allocation stream -> its blocks freed unordered

    def record_stream(self, ptr: int, stream: StreamKey) -> None:
        """``record_stream``: the allocator keeps the block until ``stream`` passed its current position."""
        with self.lock:
            rec = self.storages.get(ptr)
            if rec is not None:
                _join(rec.recorded, self.clocks.of(stream))

    def on_free(self, ptr: int, stream_id: int) -> None:
        """The block at ``ptr`` is freed into the pool of its allocation stream ``stream_id`` (the allocator's
        deallocation hook; any thread). Records the accesses of other streams the free is not ordered after."""
        with self.lock:
            self.pending.pop(ptr, None)
            rec = self.storages.pop(ptr, None)
            if rec is None:
                return
            owner = (rec.device, stream_id)
            latest: dict[StreamKey, Access] = {}   # per stream its last access: earlier ones are ordered before it
            for a in rec.reads + ([rec.write] if rec.write else []):
                if a.stream != owner and a.seq > getattr(latest.get(a.stream), "seq", -1):
                    latest[a.stream] = a
            racy = [a for a in latest.values() if rec.recorded.get(a.stream, -1) < a.seq]
            pending = self._unordered(owner, [_Freed(ptr, rec.nbytes <= _SMALL_SIZE, owner, None, racy)])
            if pending:   # (the list is pruned here too: a stream that never allocates again keeps none for long)
                pending[0].stack = _stack()
                self.freed[owner] = self._unordered(owner, self.freed.get(owner, [])) + pending

    def _unordered(self, stream: StreamKey, freed: list[_Freed]) -> list[_Freed]:
        """``freed`` without the accesses ``stream`` is now ordered after, and without entries left with none."""
        for f in freed:
            f.accesses = [a for a in f.accesses if not self.clocks.ordered_after(stream, a.seq, a.stream)]
        return [f for f in freed if f.accesses]

    def _check_reuse(self, stream: StreamKey, fresh_nbytes: list[int], reuse: Access) -> list:
        """An op on ``stream`` allocated storages of these sizes: each may get a block freed there unordered."""
        freed = self._unordered(stream, self.freed.pop(stream, []))
        pools = {n <= _SMALL_SIZE for n in fresh_nbytes}
        errors = [UnsynchronizedFreeError(f, a, reuse) for f in freed if f.small in pools for a in f.accesses]
        kept = [f for f in freed if f.small not in pools]
        if kept:
            self.freed[stream] = kept
        return errors

    def on_trace(self, kind: str, *args) -> None:
        with self.lock:
            c = self.clocks
            if kind == "stream_create":
                c.of(args[0])
            elif kind == "event_record":
                c.record(args[0], args[1])
            elif kind == "event_wait":
                c.wait(args[1], c.events.get(args[0], {}))   # an event never recorded: nothing to wait for
            elif kind == "event_synchronize":
                c.host_waits(c.events.get(args[0], {}))
            elif kind == "stream_synchronize":
                c.host_waits(dict(c.of(args[0])))
            elif kind == "device_synchronize":
                for key, clock in list(c.streams.items()):
                    if key[0] == args[0] or key[0] == "comm":
                        c.host_waits({key: clock.get(key, 0)})

    def launch(self, stream: StreamKey, reads: dict, writes: dict, fresh: set[int], op: str, device: int) -> list:
        """Record an op on ``stream`` reading/writing storages ({ptr: (tensor description, [arg names])}) of npu
        ``device``; ``fresh`` storages were allocated by this op. Returns the races found."""
        with self.lock:
            self.seq += 1
            self.clocks.tick(stream, self.seq)
            stack = _stack()
            errors: list[UnsynchronizedAccessError] = []

            def check(ptr: int, cur: Access, prev: Access | None) -> None:
                if prev is not None and prev.stream != cur.stream and \
                        not self.clocks.ordered_after(cur.stream, prev.seq, prev.stream):
                    errors.append(UnsynchronizedAccessError(ptr, cur, prev))

            for ptr in fresh:
                self.storages.pop(ptr, None)
                self.pending.pop(ptr, None)
            if fresh and stream in self.freed:
                desc, _ = writes[next(iter(fresh))]
                errors += self._check_reuse(stream, [writes[p][0][3] for p in fresh if writes[p][0][3]],
                                            Access(True, self.seq, stream, op, [], desc, stack))
            for ptr, (desc, names) in reads.items():
                if ptr in writes:
                    continue
                rec = self.storages.setdefault(ptr, _StorageRecord(device, desc[3]))
                cur = Access(False, self.seq, stream, op, names, desc, stack)
                check(ptr, cur, rec.write)
                rec.reads.append(cur)
            for ptr, (desc, names) in writes.items():
                rec = self.storages.setdefault(ptr, _StorageRecord(device, desc[3]))
                cur = Access(True, self.seq, stream, op, names, desc, stack)
                for prev in rec.reads or [rec.write]:
                    check(ptr, cur, prev)
                rec.write, rec.reads = cur, []
            return errors


def _describe(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype, t.data_ptr(), t.untyped_storage().nbytes()


def _format_tensor(desc: tuple) -> str:
    shape, dtype, ptr = desc[:3]
    return f"tensor(shape={shape}, dtype={dtype}, data_ptr={ptr:#x})"


def _storage_ptr(t: torch.Tensor) -> int:
    ptr = t.untyped_storage().data_ptr()
    return ptr if ptr else id(t.untyped_storage())   # two empty storages must not look like one


class _Accesses:
    """The storages an op reads and writes, from its schema (CSAN's ArgumentHandler)."""

    def __init__(self) -> None:
        self.reads: dict[int, tuple[tuple, list]] = {}
        self.writes: dict[int, tuple[tuple, list]] = {}
        self.inputs: set[int] = set()
        self.device: int | None = None

    def add(self, value: Any, *, write: bool, read: bool, name: str | None) -> list[int]:
        """Record the npu tensors in ``value``; returns their storages."""
        ptrs = []
        for t in npu_tensors(value):
            ptr = _storage_ptr(t)
            ptrs.append(ptr)
            if self.device is None:
                self.device = t.device.index or 0
            for table, on in ((self.writes, write), (self.reads, read)):
                if on:
                    names = table.setdefault(ptr, (_describe(t), []))[1]
                    if name and name not in names:
                        names.append(name)
        return ptrs

    def parse_inputs(self, schema, args, kwargs, *, factory: bool, collective: str | None = None) -> None:
        by_name = {a.name: a for a in schema.arguments}
        pairs = list(zip(schema.arguments, args)) + [(by_name[k], v) for k, v in kwargs.items() if k in by_name]
        for arg, value in pairs:
            if collective is not None:
                read, write = _collective_access(collective, arg.name)
            else:
                alias = arg.alias_info
                write = alias is not None and alias.is_write
                read = not factory and (alias is None or alias.is_write)
            self.inputs.update(self.add(value, write=write, read=read, name=arg.name))

    def parse_outputs(self, schema, outputs) -> set[int]:
        """Record written outputs; returns the storages the op allocated (outputs that alias no input)."""
        fresh: set[int] = set()
        results = outputs if len(schema.returns) > 1 and isinstance(outputs, (tuple, list)) else (outputs,)
        for ret, value in zip(schema.returns, results):
            alias = ret.alias_info
            if alias is not None and not alias.is_write:
                continue   # a view: metadata only
            ptrs = self.add(value, write=True, read=False, name=None)
            if alias is None:
                fresh.update(p for p in ptrs if p not in self.inputs)
        return fresh


def _collective_access(op: str, arg: str) -> tuple[bool, bool]:
    """(read, write) of a c10d op's tensor argument: c10d schemas carry no alias info, their names tell."""
    if arg.startswith("output"):
        return False, True
    if arg == "tensors":   # in place: all_reduce, broadcast, reduce; send only reads, recv only writes
        return not op.startswith("recv"), op != "send"
    return True, False


def _current_stream(device: int | None) -> StreamKey:
    idx = _C._current_device() if device is None else device
    return idx, _C._current_stream(idx)


def _group_name(value: Any) -> str:
    if isinstance(value, torch.ScriptObject):
        value = torch.distributed.ProcessGroup.unbox(value)
    return str(getattr(value, "group_name", value))


class _WaitingWork(torch.distributed.Work):
    """The Work of a c10d collective seen by the sanitizer: ``wait()`` also orders the waiting stream after
    the collective's comm-stream work. Python-visible methods delegate to the hccl Work."""

    def __init__(self, inner, tracker: _Tracker, done: Clock, keep: dict):
        super().__init__()
        self._inner, self._tracker, self._done, self._keep = inner, tracker, done, keep

    def wait(self, timeout=None):
        # C++ callers pass kNoTimeout, which reaches Python as timedelta(0): it means "no timeout", not "expire now".
        # hccl may run the collective on this thread inside wait(); its internal copies are not user accesses.
        with _disable_current_modes():
            result = self._inner.wait(timeout) if timeout else self._inner.wait()
        with self._tracker.lock:
            self._tracker.clocks.wait(_current_stream(None), self._done)
            self._release()
        return result

    def _release(self) -> None:
        # Kept alive until waited or its future consumed (see StreamSanitizerMode.live_works); caller holds the lock.
        self._keep.pop(id(self), None)

    def get_future(self):
        # Whoever consumes the future (DDP's reducer waits on it in C++) is not visible here: count its completion
        # as seen by the host, which orders every stream after the collective. This can hide a race in a
        # communication hook, never invent one.
        def seen_by_host(fut):
            with self._tracker.lock:
                self._tracker.clocks.host_waits(self._done)
                self._release()
            return fut.value()
        return self._inner.get_future().then(seen_by_host)


# Python-visible queries answer from the hccl Work.
for _name in ("is_completed", "is_success", "exception", "result", "source_rank", "synchronize"):
    setattr(_WaitingWork, _name, lambda self, _n=_name: getattr(self._inner, _n)())


class StreamSanitizerMode(TorchDispatchMode):
    """The dispatch mode that feeds every op touching npu tensors to the tracker."""

    def __init__(self, tracker: _Tracker) -> None:
        super().__init__()
        self.tracker = tracker
        # The Python Work handed to C++ must stay alive while C++ may call wait() on it: once the Python object is
        # gone, pybind's trampoline falls back to c10d's base Work::wait, which never completes. Kept until the
        # work is waited or its future consumed (DDP's reducer drops the Work after get_future()).
        self.live_works: dict[int, _WaitingWork] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.record_stream.default:   # allocator bookkeeping, not an access: what frees wait for
            out = func(*args, **kwargs)
            tensor, stream = args[0], args[1] if len(args) > 1 else kwargs["s"]
            if tensor.device.type == "npu" and not isinstance(tensor, NO_DATA):
                self.tracker.record_stream(_storage_ptr(tensor), (stream.device_index, stream.stream_id))
            return out
        if any(issubclass(t, NO_DATA) for t in types):
            return func(*args, **kwargs)   # shape propagation (DTensor's sharding, compile tracing): no device access
        if any(t is not torch.Tensor and hasattr(t, "__tensor_flatten__") for t in types):
            # A tensor subclass (DTensor, AsyncCollectiveTensor) handles the op first; the ops it runs on its inner
            # tensors (local compute, redistribution collectives, waits) come back here one by one.
            return NotImplemented
        ns, name = func.namespace, func._schema.name.split("::")[-1]
        if ns == _FUNCTIONAL_NS and name == "wait_tensor":
            out = func(*args, **kwargs)
            self._wait_collectives(list(pytree.tree_leaves((args, kwargs))))
            return out
        if ns == _FUNCTIONAL_NS and name.startswith("_wrap"):
            return func(*args, **kwargs)
        acc = _Accesses()
        collective = name if ns == "c10d" else None
        acc.parse_inputs(func._schema, args, kwargs, factory=bool(_FACTORY.match(name)), collective=collective)
        out = func(*args, **kwargs)
        fresh = acc.parse_outputs(func._schema, out) if collective is None else set()
        if not acc.reads and not acc.writes:
            return out
        if ns in ("c10d", _FUNCTIONAL_NS):
            return self._launch_collective(func, args, kwargs, acc, fresh, out)
        stream = _current_stream(acc.device)
        self._raise(self.tracker.launch(stream, acc.reads, acc.writes, fresh, str(func), acc.device))
        if _reaches_host(func, out, args, kwargs):
            with self.tracker.lock:
                self.tracker.clocks.host_waits(dict(self.tracker.clocks.of(stream)))
        return out

    def _launch_collective(self, func, args, kwargs, acc: _Accesses, fresh: set[int], out):
        schema_args = {a.name: v for a, v in zip(func._schema.arguments, args)} | kwargs
        group = schema_args.get("process_group", schema_args.get("group_name"))
        comm = ("comm", _group_name(group))
        caller = _current_stream(acc.device)
        t = self.tracker
        with t.lock:   # the collective starts after the caller's stream's work so far
            t.clocks.wait(comm, dict(t.clocks.of(caller)))
        errors = t.launch(comm, acc.reads, acc.writes, fresh, str(func), acc.device)
        with t.lock:
            t.collectives[str(func)] += 1
            done = dict(t.clocks.of(comm))
            for ptr in {**acc.reads, **acc.writes}:   # hccl record_streams its tensors on the comm stream
                if ptr in t.storages:
                    _join(t.storages[ptr].recorded, done)
            if func.namespace == _FUNCTIONAL_NS:   # waited by wait_tensor on the output (c10d: by Work.wait)
                for ptr in acc.writes:
                    t.pending[ptr] = done
        self._raise(errors)
        return self._wrap_work(out, done)

    def _wrap_work(self, out, done: Clock):
        def wrap(x):
            if isinstance(x, torch.ScriptObject) and "Work" in str(x._type()):
                inner = torch.distributed.Work.unbox(x)
                if inner is None:
                    # A synchronous collective (asyncOp=False) returns no Work, as ProcessGroupNCCL's since
                    # torch 2.8: it completed before returning, so the host has seen it.
                    with self.tracker.lock:
                        self.tracker.clocks.host_waits(done)
                    return x
                w = _WaitingWork(inner, self.tracker, done, self.live_works)
                with self.tracker.lock:
                    self.live_works[id(w)] = w
                return w.boxed()
            return x
        return tuple(wrap(x) for x in out) if isinstance(out, tuple) else wrap(out)

    def _wait_collectives(self, tensors: list) -> None:
        t = self.tracker
        with t.lock:
            for x in tensors:
                if isinstance(x, torch.Tensor) and x.device.type == "npu":
                    done = t.pending.pop(_storage_ptr(x), None)
                    if done is not None:
                        t.clocks.wait(_current_stream(x.device.index or 0), done)

    @staticmethod
    def _raise(errors: list) -> None:
        if errors:
            raise StreamSanitizerError(errors)


_HOST_VALUE_OPS = frozenset({"_local_scalar_dense", "equal", "is_nonzero"})


def _reaches_host(func, out, args, kwargs) -> bool:
    """A blocking op whose result the host sees (``.item()``, ``.cpu()``, a copy into a cpu tensor):
    the host, and so every later launch, is ordered after the current stream."""
    if func._schema.name.split("::")[-1] in _HOST_VALUE_OPS:
        return True
    if func is torch.ops.aten.copy_.default:
        return args[0].device.type == "cpu" and not (kwargs.get("non_blocking") or (len(args) > 2 and args[2]))
    return not kwargs.get("non_blocking") and \
        any(isinstance(x, torch.Tensor) and x.device.type == "cpu" for x in pytree.tree_leaves(out))


class StreamSanitizer:
    """Owns the tracker, the dispatch mode and the trace hook; :func:`enable` makes the process-wide one."""

    def __init__(self) -> None:
        self.tracker = _Tracker()
        self.mode = StreamSanitizerMode(self.tracker)
        self._remove_hooks = []
        self.enabled = False

    def enable(self) -> None:
        if self.enabled:
            return
        self._remove_hooks = [sync_trace.register_trace_hook(self.tracker.on_trace),
                              sync_trace.register_free_hook(self.tracker.on_free)]
        self.mode.__enter__()
        self.enabled = True

    def disable(self) -> None:
        if not self.enabled:
            return
        self.mode.__exit__(None, None, None)
        for remove in self._remove_hooks:
            remove()
        self.enabled = False


_sanitizer: StreamSanitizer | None = None


def enable() -> StreamSanitizer:
    """Start checking every npu op of this process (idempotent); returns the sanitizer.

    Enable it before the program's first npu op: accesses made earlier are unknown to it."""
    global _sanitizer
    if _sanitizer is None:
        _sanitizer = StreamSanitizer()
    _sanitizer.enable()
    return _sanitizer


def disable() -> None:
    """Stop checking and forget all recorded accesses."""
    global _sanitizer
    if _sanitizer is not None:
        _sanitizer.disable()
        _sanitizer = None


def is_enabled() -> bool:
    return _sanitizer is not None and _sanitizer.enabled


enable_npu_sanitizer = enable   # torch.cuda._sanitizer.enable_cuda_sanitizer's name
