"""The device runtime's C ABI (npudist/runtime_c_api.h), driven from a separately built extension through the
`npudist._C._runtime_api()` capsule, as npudist.hccl uses it: memory, copies by kind, streams, events,
device properties, error reporting."""
import ctypes
import time

import pytest
import torch

import npudist
from runtime_ext import (DEVICE_TO_DEVICE, DEVICE_TO_HOST, HOST_TO_DEVICE, HOST_TO_HOST, INVALID_DEVICE,
                         INVALID_VALUE, SUCCESS, HostGate, api, ext, launch_host_fill)


def test_table_is_a_named_versioned_capsule():
    cap = api()
    assert type(cap).__name__ == "PyCapsule"
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    assert get_name(cap) == b"npudist.runtime_api"
    # 3: memory, copies, streams, events, properties; 4: stream_wait_event; 5: communication buffers;
    # 6: the stream budget (stream_from_pool, stream_hold); 7: the graph capture stream's id;
    # 8: device_busy_besides, device_drain
    assert ext().version(cap) == 8
    with pytest.raises(ValueError):  # PyCapsule_GetPointer: wrong or missing capsule
        ext().version(object())


def test_hccl_accepts_only_the_runtime_capsule():
    hccl_c = pytest.importorskip("npudist.hccl._C")
    with pytest.raises(TypeError, match="npudist.runtime_api"):
        hccl_c._set_runtime_api(12345)
    hccl_c._set_runtime_api(api())  # what npudist.hccl does at import: idempotent


@pytest.mark.parametrize("kind", [HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, HOST_TO_HOST])
def test_memcpy_by_kind(kind):
    src_dev = "cpu" if kind in (HOST_TO_DEVICE, HOST_TO_HOST) else "npu"
    dst_dev = "cpu" if kind in (DEVICE_TO_HOST, HOST_TO_HOST) else "npu"
    src = torch.arange(1000, dtype=torch.float32, device=src_dev)
    dst = torch.zeros(1000, dtype=torch.float32, device=dst_dev)
    torch.npu.synchronize()  # the table's memcpy is not stream-ordered: the queued fills must have run
    assert ext().memcpy(api(), dst.data_ptr(), src.data_ptr(), 4000, kind) == (SUCCESS, None)
    assert torch.equal(dst.cpu(), torch.arange(1000, dtype=torch.float32))


def test_memcpy_rejects_unknown_kind_and_null():
    t = torch.zeros(4, device="npu")
    status, err = ext().memcpy(api(), t.data_ptr(), t.data_ptr(), 16, 9)
    assert status == INVALID_VALUE and "unknown copy kind 9" in err
    status, err = ext().memcpy(api(), 0, t.data_ptr(), 16, DEVICE_TO_DEVICE)
    assert status == INVALID_VALUE and "null" in err


def test_memset():
    t = torch.ones(64, dtype=torch.uint8, device="npu")
    assert ext().memset(api(), t.data_ptr() + 8, 0xAB, 16) == (SUCCESS, None)
    want = torch.ones(64, dtype=torch.uint8)
    want[8:24] = 0xAB
    assert torch.equal(t.cpu(), want)


def test_malloc_free_and_shareable_segments():
    status, _, ends_ok, shareable = ext().malloc_roundtrip(api(), 0, 1 << 20)
    assert status == SUCCESS and ends_ok
    assert shareable == 1  # fixed segments are memfd mappings peers can map (NPUDIST_SHARED_DEVICE_MEMORY)
    status, err, *_ = ext().malloc_roundtrip(api(), 99, 4096)
    assert status == INVALID_DEVICE and "Invalid npu device index 99" in err


def test_reserve_and_map_pages():
    status, _, ok = ext().reserve_map_roundtrip(api(), 2 << 20)
    assert status == SUCCESS and ok


def test_device_properties_and_count():
    assert ext().device_count(api()) == torch.npu.device_count()
    status, _, (name, total, physical) = ext().device_properties(api(), 1)
    props = torch.npu.get_device_properties(1)
    assert status == SUCCESS and (name, total, physical) == (props.name, props.total_memory, props.physical_index)
    status, err = ext().device_properties(api(), -1)
    assert status == INVALID_DEVICE and "Invalid npu device index -1" in err
    status, err = ext().set_device_status(api(), 1000)
    assert status == INVALID_DEVICE and err


def test_stream_create_priority_and_bad_ids():
    status, _, low, low_prio, destroyed = ext().stream_create(api(), 0, 0)
    assert status == SUCCESS and low > 0 and low_prio == 0 and destroyed == SUCCESS
    status, _, high, high_prio, _ = ext().stream_create(api(), 0, -1)
    assert status == SUCCESS and high != low and high_prio == -1
    assert ext().stream_query(api(), 0, 0) == 1
    assert ext().stream_query(api(), 0, 10**6) == -1  # invalid stream id
    # The last valid id is torch.npu.graph's default capture stream, above torch's pool and the sync-launch pool.
    first_sync, sync_count = npudist._C._SYNC_LAUNCH_STREAM_IDS
    capture = npudist._C._GRAPH_CAPTURE_STREAM
    assert capture == first_sync + sync_count and ext().stream_query(api(), 0, capture) == 1
    assert ext().stream_query(api(), 0, capture + 1) == -1
    status, err = ext().launch_host_fill(api(), 0, 0, b"\0", 0, 0, 10**6)
    assert status == INVALID_DEVICE and "stream id" in err


def test_event_completes_after_queued_host_work():
    s = torch.npu.Stream()
    t = torch.zeros(256, device="npu")
    launch_host_fill(t, 5.0, 100_000, s.stream_id)
    assert ext().stream_query(api(), 0, s.stream_id) == 0
    t0 = time.perf_counter()
    status, _, before, early, after, ms = ext().event_probe(api(), 0, s.stream_id)
    assert status == SUCCESS
    assert before == 0 and early != SUCCESS  # pending: elapsed time is not available yet
    assert after == 1 and ms > 10  # the host function slept 100 ms
    assert time.perf_counter() - t0 < 5
    assert torch.equal(t.cpu(), torch.full((256,), 5.0))  # the fill ran before the event completed


def test_device_busy_besides_counts_every_other_stream():
    torch.npu.synchronize(1)
    a, b = torch.npu.Stream(device=1), torch.npu.Stream(device=1)
    assert ext().device_busy_besides(api(), 1, -1) == 0
    with HostGate(1, a.stream_id):
        assert ext().device_busy_besides(api(), 1, a.stream_id) == 0  # only the excepted stream is busy
        assert ext().device_busy_besides(api(), 1, b.stream_id) == 1
        assert ext().device_busy_besides(api(), 1, -1) == 1
    torch.npu.synchronize(1)
    assert ext().device_busy_besides(api(), 1, -1) == 0
    assert ext().device_busy_besides(api(), 99, -1) == -1


def test_device_drain_waits_as_long_as_the_device_progresses():
    # Eight 40 ms tasks take 320 ms, longer than the 150 ms stall bound: a bound on the whole wait would give
    # up; the drain gives up only when no task finishes for 150 ms.
    torch.npu.synchronize(1)
    s = torch.npu.Stream(device=1)
    t = torch.zeros(8, 64, device="npu:1")
    for i in range(8):
        launch_host_fill(t[i], float(i + 1), 40_000, s.stream_id)
    t0 = time.perf_counter()
    assert ext().device_drain(api(), 1, 150) == 1
    assert time.perf_counter() - t0 > 0.25
    assert ext().device_busy_besides(api(), 1, -1) == 0
    assert torch.equal(t.cpu(), torch.arange(1, 9, dtype=torch.float32)[:, None].expand(8, 64))


def test_device_drain_gives_up_when_the_device_stalls():
    torch.npu.synchronize(1)
    s = torch.npu.Stream(device=1)
    with HostGate(1, s.stream_id):  # held until the test opens it: no progress
        t0 = time.perf_counter()
        assert ext().device_drain(api(), 1, 100) == 0
        assert 0.09 < time.perf_counter() - t0 < 10
    assert ext().device_drain(api(), 1, 100) == 1
    assert ext().device_drain(api(), 99, 100) == -1
