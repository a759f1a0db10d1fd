"""torch_npu's torch.npu names beyond torch.cuda's, with their documented semantics on the emulated device
(the surface test checks they exist; these check what they do)."""
from __future__ import annotations

import ctypes
import datetime
import warnings

import pytest
import torch
import torch.distributed as dist

import torch_npu
from npudist.device.refusal import NeedsAscendHardware


def test_sync_debug_mode_warns_and_errors_on_synchronize():
    assert torch.npu.get_sync_debug_mode() == 0
    try:
        torch.npu.set_sync_debug_mode("warn")
        assert torch.npu.get_sync_debug_mode() == 1
        with pytest.warns(UserWarning, match="synchronizing npu operation: torch.npu.synchronize"):
            torch.npu.synchronize()
        torch.npu.set_sync_debug_mode(2)
        with pytest.raises(RuntimeError, match="Stream.synchronize"):
            torch.npu.current_stream().synchronize()
        with pytest.raises(RuntimeError, match="expected one of `default`, `warn`, `error`"):
            torch.npu.set_sync_debug_mode("loud")
    finally:
        torch.npu.set_sync_debug_mode("default")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.npu.synchronize()


def test_mstx_markers_are_profiler_events():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.npu.mstx.mark("step-mark")
        assert torch.npu.mstx.range_push("outer") == 0
        assert torch.npu.mstx.range_push("inner", domain="d") == 0
        assert torch.npu.mstx.range_pop(domain="d") == 0
        assert torch.npu.mstx.range_pop() == 0
        rid = torch.npu.mstx.range_start("async-range", stream=torch.npu.current_stream())
        assert rid > 0
        torch.npu.mstx.range_end(rid)

        @torch.npu.mstx.mstx_range("decorated")
        def f(x):
            return x + 1
        assert f(1) == 2
    names = {e.name for e in prof.events()}
    assert {"step-mark", "outer", "d::inner", "async-range", "decorated"} <= names
    with pytest.warns(UserWarning):
        assert torch.npu.mstx.range_push("") == -1
    with pytest.warns(UserWarning):
        assert torch.npu.mstx.range_pop() == -1   # nothing open


def test_autocast_state_is_torch_autocast_for_npu():
    assert not torch.npu.is_autocast_enabled()
    with torch.autocast("npu", dtype=torch.bfloat16):
        assert torch.npu.is_autocast_enabled() and torch.npu.get_autocast_dtype() == torch.bfloat16
    old = torch.npu.get_autocast_dtype()
    try:
        torch.npu.set_autocast_dtype(torch.float16)
        torch.npu.set_autocast_enabled(True)
        a = torch.ones(4, 4, device="npu")
        assert (a @ a).dtype == torch.float16
    finally:
        torch.npu.set_autocast_enabled(False)
        torch.npu.set_autocast_dtype(old)


def test_legacy_storages_are_npu_typed_storages():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = torch.npu.FloatStorage(3)
        assert s.device.type == "npu" and s.dtype == torch.float32 and len(s) == 3
        assert torch.npu.LongStorage([1, 2]).tolist() == [1, 2]
        assert isinstance(s, torch.npu.FloatStorage) and not isinstance(s, torch.npu.IntStorage)


def test_deterministic_level_and_with_backward():
    assert not torch.are_deterministic_algorithms_enabled()
    try:
        with pytest.warns(UserWarning, match="conflicts"):
            torch.npu.set_deterministic_level(1)
        assert torch.are_deterministic_algorithms_enabled()
        with pytest.warns(UserWarning, match="conflicts"):
            torch.npu.set_deterministic_level(0)
        assert not torch.are_deterministic_algorithms_enabled()
        with pytest.raises(ValueError, match="level"):
            torch.npu.set_deterministic_level(-1)
        x = torch.ones(3, device="npu", requires_grad=True)
        seen = []

        def hook(g):
            seen.append(torch.are_deterministic_algorithms_enabled())
            return g
        y = torch.npu.enable_deterministic_with_backward(x * 2)
        assert torch.are_deterministic_algorithms_enabled()
        y.register_hook(hook)
        z = torch.npu.disable_deterministic_with_backward(y * 3)
        assert not torch.are_deterministic_algorithms_enabled()
        z.sum().backward()   # backward runs the marks in reverse: on at the inner region, off after
        assert seen == [True] and not torch.are_deterministic_algorithms_enabled()
        assert torch.equal(x.grad.cpu(), torch.full((3,), 6.0))
    finally:
        torch.use_deterministic_algorithms(False)


def test_options_and_precision_switches():
    torch.npu.set_option({"ACL_PRECISION_MODE": "must_keep_origin_dtype", "ACL_OP_COMPILER_CACHE_MODE": "enable"})
    assert torch.npu.ascend_options.get_option("ACL_PRECISION_MODE") == "must_keep_origin_dtype"
    with pytest.raises(ValueError, match="ACL_PRECISION_MODE"):
        torch.npu.set_option({"ACL_PRECISION_MODE": "fastest"})
    with pytest.raises(TypeError):
        torch.npu.set_option(["ACL_PRECISION_MODE"])
    assert torch.npu.matmul.allow_hf32 is False and torch.npu.conv.allow_hf32 is True
    try:
        torch.npu.matmul.allow_hf32 = True
        assert torch.npu.matmul.allow_hf32 is True
        torch.npu.matmul.cube_math_type = torch.npu.CubeMathType.USE_HF32
        with pytest.raises(TypeError):
            torch.npu.matmul.allow_hf32 = 1
        with pytest.raises(TypeError):
            torch.npu.matmul.cube_math_type = 3
    finally:
        torch.npu.matmul.allow_hf32 = False
        torch.npu.matmul.cube_math_type = torch.npu.CubeMathType.KEEP_DTYPE
    torch.npu.set_mm_bmm_format_nd(False)
    assert torch.npu.get_mm_bmm_format_nd() is False
    torch.npu.set_mm_bmm_format_nd()
    assert torch.npu.get_mm_bmm_format_nd() is True
    assert torch.npu.get_task_queue_enable() == (0 if torch.npu.launch.is_blocking() else 1)


def test_external_stream_wraps_an_acl_stream():
    handle = ctypes.c_void_p()
    rt = torch.npu.npurt()
    assert rt.npuStreamCreate(ctypes.addressof(handle)) == 0
    try:
        s = torch.npu.ExternalStream(handle.value)
        with torch.npu.stream(s):
            assert torch.npu.current_stream() == s
            y = torch.arange(4, device="npu") * 2
        s.synchronize()
        assert y.tolist() == [0, 2, 4, 6]
        with pytest.raises(ValueError, match="not an aclrtStream"):
            torch.npu.ExternalStream(12345)
    finally:
        assert rt.npuStreamDestroy(handle.value) == 0


def test_device_runtime_names():
    assert torch.npu.can_device_access_peer(0, 1)
    with pytest.raises(ValueError):
        torch.npu.can_device_access_peer(0, 10_000)
    with pytest.raises(RuntimeError, match="inf/nan"):
        torch.npu.get_npu_overflow_flag()
    with pytest.warns(UserWarning, match="useless"):
        torch.npu.clear_npu_overflow_flag()
    with pytest.warns(UserWarning, match="blas"):
        assert torch.npu.current_blas_handle() is None
    x = torch.empty(1 << 22, device="npu")
    del x
    cached = torch.npu.memory_reserved()
    torch.npu.empty_virt_addr_cache()   # the freed 16 MiB segment's address space goes back
    assert torch.npu.memory_reserved() <= cached - (1 << 24)
    torch.npu.ipc_collect()


@pytest.mark.parametrize("name, args", [("stress_detect", ()), ("stop_device", (0,)), ("restart_device", (0,)),
                                        ("check_uce_in_memory", (0,)), ("set_device_limit", (0, 1, 1)),
                                        ("get_stream_limit", (None,)), ("set_aoe", ("/tmp/x",)),
                                        ("obfuscation_initialize", (1, 0, 0))])
def test_hardware_names_refuse_naming_themselves(name, args):
    with pytest.raises(NeedsAscendHardware, match=f"torch.npu.{name}: .*emulated npu device has no such hardware"):
        getattr(torch.npu, name)(*args)


@pytest.mark.timeout(60)
def test_process_group_hccl_comm_name_and_options():
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # noqa: PLC0415
    from npudist.hccl.comm_name import backend_of  # noqa: PLC0415
    import npudist.hccl  # noqa: PLC0415
    assert ProcessGroupHCCL is npudist.hccl.ProcessGroupHCCL
    opts = ProcessGroupHCCL.Options()
    opts.hccl_config = {"hccl_buffer_size": 16}
    opts.group_id = "g"
    assert opts.group_name == "g" and opts.group_id == "g"
    store = dist.HashStore()
    dist.init_process_group("hccl", store=store, rank=0, world_size=1, pg_options=opts,
                            timeout=datetime.timedelta(seconds=30))
    try:
        backend = dist.group.WORLD._get_backend(torch.device("npu"))
        assert backend.options.hccl_config["hccl_buffer_size"] == 16   # the Options reached the backend
        name = backend.get_hccl_comm_name(0)
        assert name and name == backend.get_hccl_comm_name(0, init_comm=False)
        sub = dist.new_group([0])
        sub_name = sub._get_backend(torch.device("npu")).get_hccl_comm_name(0)
        assert sub_name != name
        assert backend_of(name) is backend and backend_of(sub_name) is not backend
        with pytest.raises(ValueError, match="not in this group|out of range"):
            backend.get_hccl_comm_name(3)
        with pytest.raises(ValueError, match="names no hccl group"):
            backend_of("nope")
    finally:
        dist.destroy_process_group()
