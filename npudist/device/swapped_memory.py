"""``torch_npu.empty_with_swapped_memory``: npu tensors whose storage is host memory outside the device budget.

As on Ascend, such a tensor is on the npu device, but its bytes are host memory: the caching allocator does
not count them (``memory_allocated``) and the device capacity does not limit them. Ascend supports only a few
operators on it (torch_npu's documentation: ``fill_``, ``zero_``, ``mul_``, ``npu_apply_adam_w``,
``npu_hans_encode``/``npu_hans_decode``; npudist has no HANS operators), and printing.

How a swapped tensor is recognised (docs/memory.md, "Swapped memory"): its storage's DataPtr has the swapped
allocator's deleter (``torch.npu.memory._is_swapped``), and the tensor object is a :class:`SwappedTensor`, a
``torch.Tensor`` subclass whose ``__torch_dispatch__`` lets the documented operators run (on the npu kernels,
unchanged) and raises ``RuntimeError`` naming any other operator. A subclass, rather than a check in the npu
op path, keeps every other npu op free of a per-argument test; ``data_ptr()``, ``device``, ``shape`` and
``untyped_storage()`` are the plain tensor's.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.utils._mode_utils import no_dispatch

from npudist import _C
from npudist.device.device_index import device_index

__all__ = ["SwappedTensor", "empty_with_swapped_memory"]


def _supported_ops() -> frozenset:
    aten = torch.ops.aten
    ops = {aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default, aten.mul_.Tensor, aten.mul_.Scalar,
           # Metadata only: a new, regular npu tensor of the same shape (Ascend's own example uses it).
           aten.empty_like.default}
    if hasattr(torch.ops.npu, "npu_apply_adam_w"):
        ops.add(torch.ops.npu.npu_apply_adam_w.default)
    return frozenset(ops)


_SUPPORTED: frozenset | None = None
_SUPPORTED_NAMES = "fill_, zero_, mul_, npu_apply_adam_w (and empty_like, printing)"


class SwappedTensor(torch.Tensor):
    """An npu tensor over swapped (host) memory; see :func:`empty_with_swapped_memory`."""

    # Results of allowed ops are plain tensors (or this object itself, for in-place ops).
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        global _SUPPORTED
        if _SUPPORTED is None:
            _SUPPORTED = _supported_ops()
        if func not in _SUPPORTED:
            raise RuntimeError(
                f"{func.name()} is not supported on a tensor allocated by torch_npu.empty_with_swapped_memory: "
                f"its memory is host memory outside the device, and (as on Ascend) only {_SUPPORTED_NAMES} "
                "work on it. Copy it into a regular npu tensor first, e.g. "
                "`x = torch.empty_like(t).fill_(1).mul_(t)`.")
        with no_dispatch():
            return func(*args, **(kwargs or {}))

    def __repr__(self, *, tensor_contents=None):
        # Printing shows the values (Ascend prints such tensors directly on A3 products) through a temporary
        # regular npu copy, so the output is exactly a plain npu tensor's.
        with no_dispatch():
            plain = torch.empty_like(self).copy_(self)
        return torch._tensor_str._str(plain, tensor_contents=tensor_contents)

    def __reduce_ex__(self, proto):
        raise RuntimeError("a tensor from torch_npu.empty_with_swapped_memory cannot be pickled or deep-copied; "
                           "copy it into a regular npu tensor first")


def empty_with_swapped_memory(size: Sequence[int] | torch.Size, dtype: torch.dtype | None = None,
                              device: Any = None) -> torch.Tensor:
    """An uninitialised npu tensor of ``size`` whose storage is host memory outside the device budget.

    ``dtype`` defaults to ``torch.get_default_dtype()``, ``device`` to the current npu device. Supported
    operators: ``fill_``, ``zero_``, ``mul_`` (as self or as the other operand), ``npu_apply_adam_w``; any
    other operator raises ``RuntimeError`` naming it.
    """
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size,)
    try:
        sizes = [int(s) for s in size]
    except TypeError as e:
        raise TypeError(f"empty_with_swapped_memory: size must be a sequence of ints, got {size!r}") from e
    if any(s < 0 for s in sizes):
        raise ValueError(f"empty_with_swapped_memory: size {tuple(sizes)} has a negative dimension")
    if dtype is None:
        dtype = torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"empty_with_swapped_memory: dtype must be a torch.dtype, got {dtype!r}")
    if device is not None and torch.device(device).type != "npu":
        raise ValueError(f"empty_with_swapped_memory: device must be an npu device, got {device!r}")
    plain = _C._npu_empty_with_swapped_memory(sizes, dtype, device_index(device))
    return SwappedTensor._make_subclass(SwappedTensor, plain)
