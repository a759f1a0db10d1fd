"""torch.npu.utilization: percent of the past second during which a kernel of the device ran.

Short windows go through the internal binding _C._npu_utilization(device, window_ns), so no test sleeps a full
second. Run in both launch modes (the second with ASCEND_LAUNCH_BLOCKING=1)."""
import time

import pytest
import torch

from npudist import _C

WINDOW_NS = 200_000_000  # 0.2 s: a dozen busy-time buckets of ~16.8 ms


def run_matmuls_for(seconds: float, device: int = 0) -> None:
    """Keep the device busy: chains of 256x256 matmuls, synchronized every 32 so the queue stays short."""
    a = torch.randn(256, 256, device=f"npu:{device}") / 16
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        y = a
        for _ in range(32):
            y = y @ a
        torch.npu.synchronize(device)


def test_result_is_an_int_percent():
    u = torch.npu.utilization()
    assert type(u) is int and 0 <= u <= 100
    assert type(torch.npu.utilization(torch.device("npu:1"))) is int


def test_idle_device_reports_zero_once_the_window_passed():
    torch.randn(64, 64, device="npu:2").sum().item()  # some kernels, then none
    torch.npu.synchronize(2)
    time.sleep(0.25)  # the 0.2 s window holds no kernel now
    assert _C._npu_utilization(2, WINDOW_NS) == 0


def test_busy_device_reports_a_high_share():
    run_matmuls_for(0.6)
    u = _C._npu_utilization(0, 400_000_000)
    assert u >= 70, u  # the gaps are the host's synchronize calls, microseconds per ~ms of matmuls
    assert torch.npu.utilization(0) >= 30  # the default 1 s window ends in these 0.6 s of kernels
    other = _C._npu_utilization(3, WINDOW_NS)
    assert other == 0, other  # a device's kernels are its own


def test_kernels_on_two_streams_count_once():
    # Two streams busy at the same time: the union of their run times, never more than 100.
    a = torch.randn(256, 256, device="npu") / 16
    s1, s2 = torch.npu.Stream(), torch.npu.Stream()
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        for s in (s1, s2):
            with torch.npu.stream(s):
                y = a
                for _ in range(16):
                    y = y @ a
        torch.npu.synchronize()
    u = _C._npu_utilization(0, WINDOW_NS)
    assert 70 <= u <= 100, u


def test_bad_device_and_window():
    n = torch.npu.device_count()
    with pytest.raises(ValueError, match=f"Invalid npu device index {n}: this process sees {n} npu device"):
        torch.npu.utilization(n)
    with pytest.raises(ValueError, match=f"Invalid npu device index {n}"):
        _C._npu_utilization(n, WINDOW_NS)
    with pytest.raises(ValueError, match="window_ns 1000 is outside"):
        _C._npu_utilization(0, 1000)
