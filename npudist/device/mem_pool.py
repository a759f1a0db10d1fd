"""torch.npu.MemPool and torch.npu.use_mem_pool (mirror ``torch.cuda.MemPool`` / ``use_mem_pool``).

A MemPool is a private pool of the npu caching allocator (``device_core/allocator/device_private_pools.cpp``):
allocations made inside ``use_mem_pool(pool)`` on that device by the current thread come from the pool's own
segments, which serve no other allocation; the pool gives its memory back once the MemPool object and every
tensor allocated from it are gone (at the next ``empty_cache`` or out-of-memory retry). See docs/memory.md.
"""
from __future__ import annotations

import contextlib
from typing import Any

from npudist import _C
from npudist.device.device_index import device_index
from npudist.device.pluggable_allocator import NPUPluggableAllocator

__all__ = ["MemPool", "use_mem_pool"]


def select_pool_segments(segments: list[dict[str, Any]], mempool_id: Any) -> list[dict[str, Any]]:
    """The snapshot segments that belong to the private pool ``mempool_id`` (a MemPool id tuple)."""
    try:
        pid = (int(mempool_id[0]), int(mempool_id[1]))
    except (TypeError, ValueError, IndexError) as e:
        raise ValueError(f"mempool_id must be a MemPool id tuple (a, b), got {mempool_id!r}") from e
    return [s for s in segments if tuple(s["segment_pool_id"]) == pid]


def _pool_id(pool: Any) -> tuple[int, int]:
    if isinstance(pool, MemPool):
        return pool.id
    raise TypeError(f"expected a torch.npu.MemPool, got {type(pool).__name__}")


class MemPool:
    """A pool of memory in the npu caching allocator.

    Args:
        allocator: an ``NPUPluggableAllocator`` whose functions provide the pool's segments (the pool still
            caches, splits and merges blocks inside them), or None for device memory.
        use_on_oom: the pool's cached blocks may serve allocations outside it when the device is otherwise
            out of memory.
        no_split: each segment of the pool serves a single allocation.
    """

    def __init__(self, allocator: Any = None, use_on_oom: bool = False, no_split: bool = False):
        if allocator is not None and not isinstance(allocator, NPUPluggableAllocator):
            raise TypeError(f"MemPool(allocator=...) expects a torch.npu.memory.NPUPluggableAllocator or None, "
                            f"got {type(allocator).__name__}")
        self._allocator = allocator  # keeps its library loaded while the pool may call it
        self._device = device_index(None)
        self._id = tuple(_C._npu_new_mempool_id())
        fns = (allocator._alloc_fn, allocator._free_fn) if allocator is not None else (0, 0)
        _C._npu_mempool_create(self._device, self._id, fns[0], fns[1], bool(use_on_oom), bool(no_split))
        self._released = False

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id, ``(0, n)`` for a user-created pool."""
        return self._id

    @property
    def allocator(self) -> Any:
        """The pluggable allocator given at construction, or None."""
        return self._allocator

    def use_count(self) -> int:
        """How many holders the pool has: 1 for this object, plus one per active ``use_mem_pool``."""
        return _C._npu_getPoolUseCount(self._device, self._id)

    def snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
        """The segments of this pool, in ``torch.npu.memory_snapshot()`` format."""
        return select_pool_segments(_C._npu_memorySnapshot()["segments"], self._id)

    def __del__(self):
        # As torch.cuda's pool: release this holder, then return what the pool has cached. Blocks of tensors
        # still alive stay with the pool until they are freed and the next empty_cache runs.
        if getattr(self, "_released", True):
            return
        self._released = True
        try:
            _C._npu_releasePool(self._device, self._id)
            _C._npu_emptyCachePool(self._id)
        except Exception:  # noqa: BLE001 - interpreter teardown: the allocator outlives us anyway
            pass


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None):
    """Route the current thread's npu allocations on ``device`` (default: the current device) to ``pool``.

    Only the calling thread is routed: work a thread started inside the block (e.g. autograd's backward
    threads) allocates from the default pools, as with torch.cuda.
    """
    pid = _pool_id(pool)
    idx = device_index(device)
    _C._npu_beginAllocateCurrentThreadToPool(idx, pid)
    try:
        yield
    finally:
        _C._npu_endAllocateToPool(idx, pid)
        _C._npu_releasePool(idx, pid)
