"""``torch.npu.npurt()``: torch_npu's NPU runtime bindings (host-memory registration and raw streams), which
DeepSpeed's NPU accelerator uses to register its pinned host buffers. Calls go to the CANN home's libascendcl.so
(``aclrtHostRegisterV2`` & co.) and return ACL error codes, as torch_npu's do. Only with npudist's emulated home:
with a real CANN configured, npudist's runtime is not the one that toolkit drives, so ``npurt()`` raises
RuntimeError (DeepSpeed then keeps its buffers mlock-only).
"""
from __future__ import annotations

import ctypes
import os

from npudist.cann import environment

ACL_ERROR_INVALID_PARAM = 100000


class NpuRt:
    """The bindings: every call returns an ACL error code (0 = success)."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib

    def npuHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 - torch_npu's names
        if not ptr:
            return ACL_ERROR_INVALID_PARAM
        return self._lib.aclrtHostRegisterV2(ctypes.c_void_p(ptr), ctypes.c_uint64(size), ctypes.c_uint32(flags))

    def npuHostUnregister(self, ptr: int) -> int:  # noqa: N802
        if not ptr:
            return ACL_ERROR_INVALID_PARAM
        return self._lib.aclrtHostUnregister(ctypes.c_void_p(ptr))

    def npuStreamCreate(self, ptr: int) -> int:  # noqa: N802 - ptr: where to store the aclrtStream
        if not ptr:
            return ACL_ERROR_INVALID_PARAM
        return self._lib.aclrtCreateStream(ctypes.c_void_p(ptr))

    def npuStreamDestroy(self, stream: int) -> int:  # noqa: N802
        if not stream:
            return ACL_ERROR_INVALID_PARAM
        return self._lib.aclrtDestroyStream(ctypes.c_void_p(stream))


_bindings: NpuRt | None = None


def npurt() -> NpuRt:
    """The NPU runtime bindings (loaded once)."""
    global _bindings
    if _bindings is None:
        if not environment.is_emulated_home():
            raise RuntimeError(f"torch.npu.npurt: ASCEND_HOME_PATH={os.environ.get('ASCEND_HOME_PATH')} selects "
                               "another CANN toolkit, whose runtime does not drive npudist's npu devices")
        path = os.path.join(environment.LIB64, "libascendcl.so")
        try:
            _bindings = NpuRt(ctypes.CDLL(path))
        except OSError as e:
            raise RuntimeError(f"torch.npu.npurt: cannot load {path} ({e}); build it with scripts/setup.sh") from None
    return _bindings
