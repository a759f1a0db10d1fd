"""Streams and events with real semantics: async host work, event completion, wait ordering."""
import time

import torch

from npudist.device import kernel_queue
from runtime_ext import launch_host_fill


def test_stream_api_shapes():
    s = torch.npu.Stream()
    hi = torch.npu.Stream(priority=-1)
    assert isinstance(s, torch.Stream) and s.device == torch.device("npu:0")
    assert hi.priority == -1 and s.priority == 0 and s != hi
    assert torch.npu.current_stream() == torch.npu.default_stream()
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s
        assert torch.accelerator.current_stream() == s
    assert torch.npu.current_stream().stream_id == 0
    s2 = torch.npu.Stream(device=2)
    with torch.npu.stream(s2):
        assert torch.npu.current_device() == 2 and torch.npu.current_stream(2) == s2
    assert torch.npu.current_device() == 0
    torch.npu.set_stream(s)
    assert torch.npu.current_stream() == s
    torch.npu.set_stream(torch.npu.default_stream())


def test_event_completes_when_stream_passes_it():
    s = torch.npu.Stream()
    t = torch.zeros(4, device="npu")
    start = torch.npu.Event(enable_timing=True)
    end = torch.npu.Event(enable_timing=True)
    start.record(s)
    launch_host_fill(t, 7.0, 200_000, s.stream_id)  # 200 ms of asynchronous "device" work
    end.record(s)
    assert not end.query() and not s.query()
    end.synchronize()
    assert end.query() and s.query()
    assert torch.equal(t.cpu(), torch.full((4,), 7.0))
    assert start.elapsed_time(end) >= 150.0


def test_wait_stream_orders_later_compute():
    side = torch.npu.Stream()
    t = torch.zeros(1000, device="npu")
    launch_host_fill(t, 3.0, 100_000, side.stream_id)
    t0 = time.monotonic()
    torch.npu.current_stream().wait_stream(side)  # later compute must see the fill
    if kernel_queue.is_blocking():
        assert time.monotonic() - t0 >= 0.05  # the host waits
    else:
        assert not torch.npu.current_stream().query()  # the current stream's queue waits instead
    assert t.sum().item() == 3000.0


def test_wait_event_and_synchronize():
    s = torch.npu.Stream(device=1)
    t = torch.zeros(8, device="npu:1")
    launch_host_fill(t, 1.0, 50_000, s.stream_id)
    e = s.record_event()
    torch.npu.current_stream(1).wait_event(e)
    assert e.query() or not kernel_queue.is_blocking()  # only blocking launch makes wait_event block the host
    assert t.sum().item() == 8.0
    launch_host_fill(t, 2.0, 50_000, s.stream_id)
    torch.npu.synchronize(1)
    assert s.query() and t.sum().item() == 16.0


def test_host_work_runs_in_order():
    s = torch.npu.Stream()
    t = torch.zeros(1, device="npu")
    for i in range(20):
        launch_host_fill(t, float(i), 1000 if i % 2 else 0, s.stream_id)
    s.synchronize()
    assert t.item() == 19.0


def test_unrecorded_event_is_complete():
    e = torch.npu.Event()
    assert e.query()
    e.synchronize()
    torch.npu.current_stream().wait_event(e)
