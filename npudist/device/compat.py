"""torch.npu names that Ascend-targeting libraries call besides torch.cuda's (DeepSpeed, LLaMA-Factory, ...).

* ``set_compile_mode(jit_compile=...)`` / ``is_jit_compile_false()``: Ascend chooses between compiling
  operators just in time and using prebuilt binaries. The emulated device runs CPU kernels and compiles
  nothing, so the setting is recorded (and reported back) but changes no computation.
* The legacy tensor types ``torch.npu.FloatTensor`` ... ``BFloat16Tensor``: ``isinstance(t, torch.npu.FloatTensor)``
  is true for float32 npu tensors; calling one builds an npu tensor like the legacy constructors
  (``FloatTensor(2, 3)`` uninitialised of that size, ``FloatTensor([1, 2])`` from data).
* ``_lazy_call(fn)``: runs ``fn`` now (the runtime initialises lazily, nothing has to be queued).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

_jit_compile = True


def set_compile_mode(jit_compile: bool = False) -> None:
    """Record Ascend's operator compile mode (no effect on the emulated device; see module doc)."""
    global _jit_compile
    if not isinstance(jit_compile, bool):
        raise ValueError(f"set_compile_mode: jit_compile must be a bool, got {jit_compile!r}")
    _jit_compile = jit_compile


def is_jit_compile_false() -> bool:
    """True after ``set_compile_mode(jit_compile=False)``."""
    return not _jit_compile


def _lazy_call(callable: Callable[[], Any], **kwargs) -> None:
    """Run ``callable`` now: the emulated runtime needs no deferred initialisation."""
    callable()


class _LegacyTensorMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Tensor) and obj.device.type == "npu" and obj.dtype == cls.dtype


class _LegacyTensor(metaclass=_LegacyTensorMeta):
    dtype: torch.dtype = torch.float32

    def __new__(cls, *args, device: Any = None):
        dev = torch.device("npu", torch.npu.current_device()) if device is None else torch.device(device)
        if len(args) == 1 and isinstance(args[0], torch.Size):
            args = tuple(args[0])
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return torch.empty(args, dtype=cls.dtype, device=dev)
        if len(args) == 1:
            return torch.tensor(args[0], dtype=cls.dtype, device=dev)
        raise ValueError(f"torch.npu.{cls.__name__}(*sizes) or ({cls.__name__}(data)), got {args!r}")


def _legacy(name: str, dtype: torch.dtype) -> type:
    return type(name, (_LegacyTensor,), {"dtype": dtype, "__module__": "torch.npu",
                                          "__doc__": f"Legacy type of {dtype} npu tensors."})


BFloat16Tensor = _legacy("BFloat16Tensor", torch.bfloat16)
BoolTensor = _legacy("BoolTensor", torch.bool)
ByteTensor = _legacy("ByteTensor", torch.uint8)
CharTensor = _legacy("CharTensor", torch.int8)
DoubleTensor = _legacy("DoubleTensor", torch.float64)
FloatTensor = _legacy("FloatTensor", torch.float32)
HalfTensor = _legacy("HalfTensor", torch.float16)
IntTensor = _legacy("IntTensor", torch.int32)
LongTensor = _legacy("LongTensor", torch.int64)
ShortTensor = _legacy("ShortTensor", torch.int16)

def npurt():
    """torch_npu's NPU runtime bindings (npuHostRegister, npuHostUnregister, npuStreamCreate, npuStreamDestroy) over
    the CANN home's ACL runtime; DeepSpeed registers its pinned buffers with them (npudist/cann/npurt.py)."""
    from npudist.cann.npurt import npurt as bindings  # noqa: PLC0415 - ctypes load on first use only

    return bindings()


__all__ = ["npurt", "set_compile_mode", "is_jit_compile_false", "_lazy_call", "BFloat16Tensor", "BoolTensor", "ByteTensor",
           "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor", "IntTensor", "LongTensor", "ShortTensor"]
