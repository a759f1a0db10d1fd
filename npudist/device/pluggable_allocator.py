"""``torch.npu.memory.NPUPluggableAllocator``: allocation functions from a user's shared library, for
``change_current_allocator`` (every npu allocation) or ``MemPool(allocator=...)`` (one pool's segments)."""
from __future__ import annotations

import ctypes
import os

__all__ = ["NPUPluggableAllocator"]


class _NPUAllocator:
    """Base of allocators that :func:`change_current_allocator` accepts."""


class NPUPluggableAllocator(_NPUAllocator):
    """An allocator from a shared library (as ``torch.cuda.memory.CUDAPluggableAllocator``).

    The library exports ``void* alloc_fn(size_t size, int device, void* stream)`` and
    ``void free_fn(void* ptr, size_t size, int device, void* stream)``; ``stream`` carries the npu stream
    id. Caching, statistics and snapshots are the library's business (torch.npu stats raise while it is
    active); ``record_stream`` is ignored for its memory.
    """

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str):
        try:
            self._lib = ctypes.CDLL(os.fspath(path_to_so_file))
        except OSError as e:
            raise ValueError(f"NPUPluggableAllocator: cannot load {path_to_so_file!r}: {e}") from e
        addrs = []
        for name in (alloc_fn_name, free_fn_name):
            try:
                addrs.append(ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value)
            except AttributeError as e:
                raise ValueError(f"NPUPluggableAllocator: {path_to_so_file!r} does not export {name!r} "
                                 "(declare it extern \"C\")") from e
        self._alloc_fn, self._free_fn = addrs
        self.path = os.fspath(path_to_so_file)
