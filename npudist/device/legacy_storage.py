"""torch.npu's legacy typed storages (``torch.npu.FloatStorage`` ... ``BFloat16Storage``), as torch.cuda's.

``torch.npu.FloatStorage(n)`` is an npu ``TypedStorage`` of n float32 elements; ``isinstance(t.untyped_storage()
...)`` style checks and ``tensor.storage().type()`` names follow torch's legacy storage rules (torch picks the
device from the class's module, ``torch.npu``). Deprecated in torch, kept because Ascend code still names them.
"""
from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

__all__ = ["BoolStorage", "ByteStorage", "ShortStorage", "LongStorage", "IntStorage", "HalfStorage",
           "CharStorage", "DoubleStorage", "FloatStorage", "BFloat16Storage"]


class _NPULegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for npu storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for npu storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for npu storage")


def _storage(name: str, dtype: torch.dtype) -> type:
    def dtype_(cls):
        _warn_typed_storage_removal()
        return cls._dtype

    return type(name, (_NPULegacyStorage,), {
        "__module__": "torch.npu",   # torch's TypedStorage takes the device from the module name
        "__doc__": f"Legacy npu storage of {dtype}.",
        "dtype": classproperty(dtype_),
        "_dtype": classproperty(lambda cls, d=dtype: d),
    })


BoolStorage = _storage("BoolStorage", torch.bool)
ByteStorage = _storage("ByteStorage", torch.uint8)
ShortStorage = _storage("ShortStorage", torch.int16)
LongStorage = _storage("LongStorage", torch.int64)
IntStorage = _storage("IntStorage", torch.int32)
HalfStorage = _storage("HalfStorage", torch.float16)
CharStorage = _storage("CharStorage", torch.int8)
DoubleStorage = _storage("DoubleStorage", torch.float64)
FloatStorage = _storage("FloatStorage", torch.float32)
BFloat16Storage = _storage("BFloat16Storage", torch.bfloat16)
