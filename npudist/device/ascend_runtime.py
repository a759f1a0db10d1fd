"""torch_npu's device-runtime names beyond torch.cuda's: peer access, overflow flags, external streams,
memory housekeeping, and the ones whose meaning is Ascend hardware (refused, npudist.device.refusal).
"""
from __future__ import annotations

import warnings
from typing import Any

import torch

from npudist.device import core, memory
from npudist.device.refusal import refuses
from npudist.device.streams import _NPU_TYPE, Stream

__all__ = ["can_device_access_peer", "get_npu_overflow_flag", "clear_npu_overflow_flag", "current_blas_handle",
           "empty_virt_addr_cache", "ipc_collect", "ExternalStream", "stress_detect", "stop_device",
           "restart_device", "check_uce_in_memory", "obfuscation_initialize", "obfuscation_finalize",
           "obfuscation_calculate"]


def can_device_access_peer(device_id: int, peer_device_id: int) -> bool:
    """True for any two visible devices: every npu device's memory is host memory of this process, which
    every device (and the hccl backend's peer mapping) reads and writes directly."""
    core._checked_index(device_id, optional=False)
    core._checked_index(peer_device_id, optional=False)
    return True


def get_npu_overflow_flag() -> bool:
    """Raises, as torch_npu does on devices with IEEE inf/nan arithmetic (Ascend 910B and later), which the
    emulated device has: check values instead (``torch.isfinite``, ``GradScaler``)."""
    raise RuntimeError("torch.npu.get_npu_overflow_flag: unsupported on a device with inf/nan arithmetic (as "
                       "torch_npu on Ascend 910B and later): overflow gives inf/nan in the result; check the "
                       "values (torch.isfinite) instead")


def clear_npu_overflow_flag() -> None:
    """Warns and does nothing, as torch_npu on devices with inf/nan arithmetic (there is no flag to clear)."""
    warnings.warn("torch.npu.clear_npu_overflow_flag is useless on a device with inf/nan arithmetic (as torch_npu "
                  "on Ascend 910B and later). Please remove it.", stacklevel=2)


def current_blas_handle() -> None:
    """None with a warning, as torch_npu: an NPU has no BLAS handle."""
    warnings.warn("NPU does not use blas handle.", stacklevel=2)


def empty_virt_addr_cache() -> None:
    """Release the address space of unused expandable-segment pages and cached segments: in the emulated
    allocator the address space of a segment is its host mapping, which :func:`torch.npu.empty_cache`
    unmaps, so this is that call."""
    memory.empty_cache()


def ipc_collect() -> None:
    """Release npu memory held for other processes through IPC. npudist exports no IPC handles of npu memory
    (torch.multiprocessing refuses to share an npu tensor: "_share_fd_: only available on CPU"), so no memory
    is ever held for a consumer and there is nothing to release."""
    core.init()


_STREAM_TAG = 0x5354 << 48     # the emulated ACL's aclrtStream handles: tag | device << 32 | stream id
_TAG_MASK = 0xFFFF << 48


class ExternalStream(Stream):
    """An npu stream created outside torch (an ``aclrtStream`` from the CANN home's ACL, e.g.
    ``torch.npu.npurt().npuStreamCreate``), usable wherever a ``torch.npu.Stream`` is. The caller keeps the
    ACL stream alive while it is used (as torch_npu requires)."""

    def __new__(cls, stream_ptr: int, device: Any = None, **kwargs):
        if kwargs.get("priority", 0) != 0 or kwargs.get("is_sync_launch", 0) != 0:
            raise RuntimeError("torch.npu.ExternalStream: priority and is_sync_launch must keep their defaults "
                               "(0) for an external stream")
        if isinstance(stream_ptr, bool) or not isinstance(stream_ptr, int) or stream_ptr & _TAG_MASK != _STREAM_TAG:
            raise ValueError(f"torch.npu.ExternalStream: stream_ptr {stream_ptr!r} is not an aclrtStream of the "
                             "emulated CANN runtime (create it with torch.npu.npurt().npuStreamCreate or aclrtCreateStream)")
        index = (stream_ptr >> 32) & 0xFFFF
        stream_id = stream_ptr & 0xFFFFFFFF
        if device is not None and core._checked_index(device) != index:
            raise ValueError(f"torch.npu.ExternalStream: stream_ptr belongs to npu:{index}, not to {device!r}")
        return super().__new__(cls, stream_id=stream_id, device_index=index, device_type=_NPU_TYPE)


@refuses("the online AI-core / HCCS link stress test runs on the chip")
def stress_detect(detect_type="aic"): ...


@refuses("stopping a device after an uncorrectable memory error (UCE) is Ascend's hardware fault recovery")
def stop_device(device_id): ...


@refuses("restarting a device after an uncorrectable memory error (UCE) is Ascend's hardware fault recovery")
def restart_device(device_id, rebuild_all_resources=False, disable_tensor_unsafe_check=False): ...


@refuses("it reads the device memory's uncorrectable-error (UCE) records kept by the hardware")
def check_uce_in_memory(device_id): ...


@refuses("model obfuscation runs in the chip's trusted execution environment")
def obfuscation_initialize(hidden_size, tp_rank, cmd, *, data_type=None, model_obf_seed_id=0, data_obf_seed_id=0,
                           thread_num=4, obf_coefficient=1.0): ...


@refuses("model obfuscation runs in the chip's trusted execution environment")
def obfuscation_finalize(fd_to_close): ...


@refuses("model obfuscation runs in the chip's trusted execution environment")
def obfuscation_calculate(fd, x, param, *, obf_coefficient=1.0): ...
