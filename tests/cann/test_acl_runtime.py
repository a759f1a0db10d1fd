"""pyACL of the emulated home (``import acl``) over libascendcl.so: values, (value, ret) tuples, ACL error codes with
messages, and one device runtime with torch (memory, current device, streams)."""
import ctypes

import pytest
import torch

import npudist  # noqa: F401  (registers npu; puts the emulated home's python dir on sys.path)

acl = pytest.importorskip("acl", reason="the emulated home's acl module is not importable (run scripts/setup.sh)")

ACL_SUCCESS, ACL_ERROR_INVALID_PARAM, ACL_ERROR_REPEAT_INITIALIZE = 0, 100000, 100002
ACL_ERROR_RT_INVALID_DEVICEID, ACL_ERROR_RT_MEMORY_ALLOCATION = 107001, 207001
ACL_HBM_MEM, ACL_MEM_MALLOC_HUGE_FIRST = 1, 0
H2D, D2H, D2D = 1, 2, 3
MIB = 1 << 20


def test_device_memory_copies_and_accounting():
    free0, total, ret = acl.rt.get_mem_info(ACL_HBM_MEM)
    assert ret == ACL_SUCCESS and total == torch.npu.get_device_properties(0).total_memory
    dev, ret = acl.rt.malloc(4 * MIB, ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == ACL_SUCCESS and dev
    free1, _, _ = acl.rt.get_mem_info(ACL_HBM_MEM)
    assert free1 <= free0 - 4 * MIB  # counted on the device (npu-smi's record)
    host, ret = acl.rt.malloc_host(4 * MIB)
    assert ret == ACL_SUCCESS and host % 4096 == 0
    ctypes.memset(host, 0x5A, 4 * MIB)
    assert acl.rt.memcpy(dev, 4 * MIB, host, 4 * MIB, H2D) == ACL_SUCCESS
    assert acl.rt.memset(host, 4 * MIB, 0, 4 * MIB) == ACL_SUCCESS
    stream, ret = acl.rt.create_stream()
    assert ret == ACL_SUCCESS and stream
    assert acl.rt.memcpy_async(host, 4 * MIB, dev, 4 * MIB, D2H, stream) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(stream) == ACL_SUCCESS
    assert ctypes.string_at(host + 4 * MIB - 3, 3) == b"ZZZ"
    assert acl.rt.destroy_stream(stream) == ACL_SUCCESS
    assert acl.rt.free(dev) == ACL_SUCCESS and acl.rt.free_host(host) == ACL_SUCCESS
    assert acl.rt.get_mem_info(ACL_HBM_MEM)[0] >= free1 + 4 * MIB


def test_errors_are_acl_codes_with_messages():
    dev, _ = acl.rt.malloc(MIB, ACL_MEM_MALLOC_HUGE_FIRST)
    assert acl.rt.free(dev) == ACL_SUCCESS
    assert acl.rt.free(dev) == ACL_ERROR_INVALID_PARAM
    assert "was not returned by aclrtMalloc (or is already freed)" in acl.get_recent_err_msg()
    assert acl.get_recent_err_msg() == ""  # read once, then cleared
    assert acl.rt.malloc(0, ACL_MEM_MALLOC_HUGE_FIRST)[1] == ACL_ERROR_INVALID_PARAM
    assert "size must be greater than 0" in acl.get_recent_err_msg()
    assert acl.rt.malloc(1 << 50, ACL_MEM_MALLOC_HUGE_FIRST)[1] == ACL_ERROR_RT_MEMORY_ALLOCATION
    assert "requested on device 0" in acl.get_recent_err_msg()
    assert acl.rt.memcpy(1, 4, 2, 8, H2D) == ACL_ERROR_INVALID_PARAM
    assert "count 8 exceeds destMax 4" in acl.get_recent_err_msg()
    assert acl.rt.set_device(99) == ACL_ERROR_RT_INVALID_DEVICEID
    assert "Invalid npu device index 99" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(0x1234) == ACL_ERROR_INVALID_PARAM
    assert "is not a stream handle" in acl.get_recent_err_msg()
    assert acl.init() in (ACL_SUCCESS, ACL_ERROR_REPEAT_INITIALIZE)
    assert acl.init() == ACL_ERROR_REPEAT_INITIALIZE
    assert acl.finalize() == ACL_SUCCESS


def test_one_runtime_with_torch_device_and_events():
    assert acl.rt.get_device_count() == (torch.npu.device_count(), ACL_SUCCESS)
    assert acl.rt.set_device(2) == ACL_SUCCESS
    try:
        assert torch.npu.current_device() == 2 and acl.rt.get_device() == (2, ACL_SUCCESS)
    finally:
        torch.npu.set_device(0)
    assert acl.rt.get_device() == (0, ACL_SUCCESS)
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    assert acl.rt.record_event(start, 0) == ACL_SUCCESS   # null stream: the current device's default stream
    x = torch.randn(256, 256, device="npu")
    (x @ x).sum()
    assert acl.rt.record_event(end, 0) == ACL_SUCCESS
    assert acl.rt.synchronize_event(end) == ACL_SUCCESS
    ms, ret = acl.rt.event_elapsed_time(start, end)
    assert ret == ACL_SUCCESS and ms >= 0
    assert acl.rt.destroy_event(start) == acl.rt.destroy_event(end) == ACL_SUCCESS


def test_npurt_host_registration_as_torch_npu():
    rt = torch.npu.npurt()
    buf = torch.empty(3 * 4096, dtype=torch.uint8).share_memory_()  # page-aligned host memory
    ptr = buf.data_ptr()
    assert rt.npuHostRegister(ptr, 8192, 0x2) == ACL_SUCCESS                     # ACL_HOST_REG_MAPPED
    assert rt.npuHostRegister(ptr + 4096, 4096, 0x2) == ACL_ERROR_INVALID_PARAM  # overlaps
    assert "overlaps a registered range" in acl.get_recent_err_msg()
    assert rt.npuHostUnregister(ptr) == ACL_SUCCESS
    assert rt.npuHostUnregister(ptr) == ACL_ERROR_INVALID_PARAM
    assert rt.npuHostRegister(ptr + 1, 4096, 0x2) == ACL_ERROR_INVALID_PARAM     # MAPPED needs 4 KiB alignment
    assert rt.npuHostRegister(0, 4096, 0x2) == ACL_ERROR_INVALID_PARAM
    slot = ctypes.c_void_p()
    assert rt.npuStreamCreate(ctypes.addressof(slot)) == ACL_SUCCESS and slot.value
    assert rt.npuStreamDestroy(slot.value) == ACL_SUCCESS


def test_deepspeed_registers_pinned_host_memory_through_npurt():
    accel = pytest.importorskip("deepspeed.accelerator.npu_accelerator",
                                reason="deepspeed is not installed (requirements-test.txt pins it)")
    npu = accel.NPU_Accelerator()
    buf = torch.empty(2 * 4096, dtype=torch.uint8).share_memory_()
    assert npu.register_host_memory(buf.data_ptr(), 8192) is True
    npu.unregister_host_memory(buf.data_ptr())
    with pytest.raises(RuntimeError, match="npuHostUnregister failed with rc=100000"):
        npu.unregister_host_memory(buf.data_ptr())
