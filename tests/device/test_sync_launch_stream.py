"""torch.npu.SyncLaunchStream: kernels launched on it run on the launching thread before the call returns, in
order after the stream's queued work and the events it waits for; other streams keep queueing.

Run in both launch modes (the second with ASCEND_LAUNCH_BLOCKING=1)."""
import ctypes
import threading

import pytest
import torch

from npudist import _C
from npudist.device import kernel_queue


def host_values(t: torch.Tensor) -> list[float]:
    """The tensor's bytes read on the host right now (npu memory is host memory): no synchronization, unlike
    .cpu(), so a kernel that has not run yet shows as the old values."""
    assert t.dtype == torch.float32 and t.is_contiguous()
    return list((ctypes.c_float * t.numel()).from_address(t.data_ptr()))


def test_api_as_torch_npu():
    s = torch.npu.SyncLaunchStream()
    assert isinstance(s, torch.Stream) and s.device == torch.device("npu:0")
    assert repr(s) == f"<torch_npu.npu.SyncLaunchStream device=npu:0 npu_stream={s.npu_stream:#x}>"
    assert s.priority == 0 and torch.npu.SyncLaunchStream(priority=-1).priority == 0  # one pool, as torch_npu
    same = torch.npu.SyncLaunchStream(stream_id=s.stream_id, device_index=0, device_type=s.device_type)
    assert s == same and hash(s) == hash(same) and len({s, same}) == 1
    plain = torch.npu.Stream(stream_id=s.stream_id, device_index=0, device_type=s.device_type)
    assert s != plain and s != torch.npu.Stream()  # torch_npu: equal only to a SyncLaunchStream
    assert s.query()
    s.synchronize()
    s.set_data_preprocess_stream(True)
    with pytest.raises(TypeError, match="must be a bool"):
        s.set_data_preprocess_stream(1)
    with pytest.raises(TypeError, match="priority must be an int"):
        torch.npu.SyncLaunchStream(priority="high")
    with pytest.raises(ValueError, match="Invalid npu device index 99"):
        torch.npu.SyncLaunchStream(device=99)
    s2 = torch.npu.SyncLaunchStream(device=1)
    assert s2.device == torch.device("npu:1")
    first, count = _C._SYNC_LAUNCH_STREAM_IDS  # torch_npu's Stream(is_sync_launch=1) takes the same pool
    assert first <= torch.npu.Stream(is_sync_launch=1).stream_id < first + count


def test_stream_context_and_current_stream():
    s = torch.npu.SyncLaunchStream()
    prev = torch.npu.current_stream()
    with torch.npu.stream(s):
        cur = torch.npu.current_stream()
        assert cur == s and isinstance(cur, torch.npu.SyncLaunchStream)
        y = torch.ones(8, device="npu") * 3
    assert torch.npu.current_stream() == prev
    assert torch.equal(y.cpu(), torch.full((8,), 3.0))


def compute(seed: int) -> list[torch.Tensor]:
    torch.npu.manual_seed(seed)
    a = torch.randn(16, 24, device="npu")
    b = torch.randn(24, 8, device="npu")
    c = (a @ b).softmax(-1)
    d = torch.nn.functional.gelu(c * 3 - 1).sum(0)
    e = torch.cumsum(a, 1)[:, ::3].contiguous()
    return [t.cpu() for t in (a, b, c, d, e)]


def test_results_bitwise_equal_to_a_normal_stream():
    with torch.npu.stream(torch.npu.Stream()):
        want = compute(7)
    with torch.npu.stream(torch.npu.SyncLaunchStream()):
        got = compute(7)
    for w, g in zip(want, got):
        assert torch.equal(w, g)


def test_kernel_has_run_when_the_call_returns():
    x = torch.zeros(4, device="npu")
    x.add_(1)  # a first call runs synchronously; later ones of this signature may queue
    torch.npu.synchronize()
    kernel_queue.reset_launch_counts()
    with torch.npu.stream(torch.npu.SyncLaunchStream()):
        x.add_(1)
        assert host_values(x) == [2.0] * 4  # read before any synchronization
    counts = kernel_queue.launch_counts()
    assert counts["queued"] == 0 and counts["inline"] == 0 and counts["synchronous"] >= 1


@pytest.mark.skipif(kernel_queue.is_blocking(), reason="an ExternalEvent wait before its record raises when blocking")
def test_a_normal_stream_behind_a_gate_has_not_run_the_kernel():
    # The contrast: on a normal stream held by an unrecorded ExternalEvent the same add is queued, not run.
    x = torch.zeros(4, device="npu")
    x.add_(1)
    torch.npu.synchronize()
    s = torch.npu.Stream()
    gate = torch.npu.ExternalEvent()
    gate.wait(s)
    with torch.npu.stream(s):
        x.add_(1)
    assert host_values(x) == [1.0] * 4
    gate.record(torch.npu.Stream())
    s.synchronize()
    assert host_values(x) == [2.0] * 4


@pytest.mark.skipif(kernel_queue.is_blocking(), reason="an ExternalEvent wait before its record raises when blocking")
@pytest.mark.timeout(60)
def test_ordered_after_the_streams_and_events_it_waits_for():
    x = torch.zeros(4, device="npu")
    x.fill_(1.0)
    torch.npu.synchronize()
    producer = torch.npu.Stream()
    gate, gate2 = torch.npu.ExternalEvent(), torch.npu.ExternalEvent()
    gate.wait(producer)  # holds the producer until the timer below records the gate
    with torch.npu.stream(producer):
        x.fill_(5.0)
    sync = torch.npu.SyncLaunchStream()
    sync.wait_stream(producer)
    timers = [threading.Timer(0.2, g.record, args=(torch.npu.Stream(),)) for g in (gate, gate2)]
    timers[0].start()
    try:
        with torch.npu.stream(sync):
            y = x + 1  # runs here once the producer's fill ran
            assert host_values(y) == [6.0] * 4
        # Outside the SyncLaunchStream's scope: an ExternalEvent issued while it is current runs synchronously.
        gate2.wait(producer)
        with torch.npu.stream(producer):
            x.fill_(9.0)
        done = producer.record_event()
        sync.wait_event(done)
        timers[1].start()
        with torch.npu.stream(sync):
            z = x * 2  # runs here once the event, recorded after the second fill, completed
            assert host_values(z) == [18.0] * 4
    finally:
        for t in timers:
            if not t.is_alive() and not t.finished.is_set():
                t.start()  # a failure before its start: release the producer all the same
            t.join()
    torch.npu.synchronize()


def test_kernel_error_raises_at_the_call():
    x = torch.arange(6, dtype=torch.float32, device="npu")
    good = torch.tensor([0, 2], device="npu")
    torch.index_select(x, 0, good)  # the signature's first call: later calls may be queued
    torch.npu.synchronize()
    bad = torch.tensor([0, 60], device="npu")
    with torch.npu.stream(torch.npu.SyncLaunchStream()):
        with pytest.raises((RuntimeError, IndexError), match="out of range|index"):
            torch.index_select(x, 0, bad)
    torch.npu.synchronize()  # the error was raised at the call, none is left pending


def test_other_streams_keep_queueing():
    if kernel_queue.is_blocking():
        pytest.skip("blocking launch queues nothing")
    x = torch.zeros(64, 64, device="npu")
    for _ in range(3):
        x = x + 1  # learn the signature (first call, timing samples)
    torch.npu.synchronize()
    gate = torch.npu.ExternalEvent()
    s = torch.npu.Stream()
    gate.wait(s)  # keeps s busy, so its kernels are queued rather than run inline on an idle stream
    kernel_queue.reset_launch_counts()
    with torch.npu.stream(torch.npu.SyncLaunchStream()):
        with torch.npu.stream(s):
            y = x + 1
        z = x + 2
    counts = kernel_queue.launch_counts()
    assert counts["queued"] == 1 and counts["synchronous"] >= 1
    gate.record(torch.npu.Stream())
    s.synchronize()
    assert torch.equal(y.cpu(), torch.full((64, 64), 4.0)) and torch.equal(z.cpu(), torch.full((64, 64), 5.0))
