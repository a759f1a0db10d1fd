"""Trace hooks of npu synchronization and deallocation.

Every synchronization that goes through torch.npu (stream creation, event record/wait, stream/event/device
synchronize) is reported to the callables registered with :func:`register_trace_hook` (the stream sanitizer,
docs/debugging.md). With no hook registered the cost is one list test at the call site (``if hooks:``).

Deallocations come from the C++ allocator (``raw_delete``, device_core/allocator/npu_caching_allocator.cpp): while
a hook registered with :func:`register_free_hook` exists, the allocator calls :func:`_on_free` before each npu block
goes back to its stream's pool (torch.cuda's ``gpu_trace.register_callback_for_memory_deallocation``). With none,
no callback is set in C++ and a free pays one relaxed atomic load.

A module of its own so that ``core`` (device synchronize) and ``streams`` (streams and events) both report
here without importing each other.
"""
from __future__ import annotations

import atexit
from typing import Callable

# Hooks called as hook(kind, *args); kinds and args:
#   "stream_create" (stream_key,)        "event_record" (event_id, stream_key)
#   "event_wait" (event_id, stream_key)  "event_synchronize" (event_id,)
#   "stream_synchronize" (stream_key,)   "device_synchronize" (device_index,)
# stream_key is (device_index, stream_id).
hooks: list[Callable[..., None]] = []

# Deallocation hooks, called as hook(data_ptr, stream_id): the block at data_ptr (a storage's data_ptr) is being
# freed by the calling thread and returns to the pool of stream stream_id of its device.
free_hooks: list[Callable[[int, int], None]] = []


def register_trace_hook(hook: Callable[..., None]) -> Callable[[], None]:
    """Call ``hook(kind, *args)`` on every npu stream/event synchronization; returns a function removing it."""
    hooks.append(hook)
    return lambda: hooks.remove(hook) if hook in hooks else None


def trace(kind: str, *args) -> None:
    for hook in list(hooks):
        hook(kind, *args)


def register_free_hook(hook: Callable[[int, int], None]) -> Callable[[], None]:
    """Call ``hook(data_ptr, stream_id)`` before every npu block is freed; returns a function removing it.

    The hook runs on the freeing thread (any thread, the GIL taken) inside a tensor's deallocation: it must not
    raise (an exception is printed as unraisable) and must not run npu ops."""
    from npudist import _C
    free_hooks.append(hook)
    _C._npu_setFreeHook(_on_free)

    def remove() -> None:
        if hook in free_hooks:
            free_hooks.remove(hook)
        if not free_hooks:
            _C._npu_setFreeHook(None)
    return remove


def _on_free(data_ptr: int, stream_id: int) -> None:
    for hook in list(free_hooks):
        hook(data_ptr, stream_id)


@atexit.register
def _clear_free_hook() -> None:
    # Tensors freed while the interpreter tears modules down must not call into half-destroyed Python code.
    if free_hooks:
        free_hooks.clear()
        from npudist import _C
        _C._npu_setFreeHook(None)
