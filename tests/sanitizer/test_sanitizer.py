"""The npu stream sanitizer on one process: an unsynchronized cross-stream access is reported with the tensor,
both streams and both stacks; every torch.npu way of ordering the streams makes the same program pass."""
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from npudist.device import sanitizer
from npudist.device.sanitizer import StreamSanitizerError

pytestmark = pytest.mark.timeout(120)


def _produce_on_side_stream():
    """``b`` written by a kernel on a side stream that was itself ordered after the inputs' creation."""
    side = torch.npu.Stream()
    a = torch.ones(32, 32, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        b = a @ a  # SIDE-WRITE
    a.record_stream(side)  # a is freed at return: its block must wait for the side stream's read
    return side, b


def test_read_without_wait_is_flagged(san):
    side, b = _produce_on_side_stream()
    with pytest.raises(StreamSanitizerError) as info:
        b.sum()  # RACY-READ
    msg = str(info.value)
    assert "shape=(32, 32), dtype=torch.float32" in msg and f"data_ptr={b.data_ptr():#x}" in msg
    assert "reading" in msg and "aten.sum" in msg and "(default stream)" in msg
    assert f"stream {side.stream_id:#x}" in msg and "writing" in msg and "aten.mm" in msg
    # both Python stacks: the current access's line and the earlier write's line
    assert "b.sum()  # RACY-READ" in msg and "b = a @ a  # SIDE-WRITE" in msg
    assert "npudist/device/sanitizer.py" not in msg  # the dispatch mode's own frames are left out
    (err,) = info.value.errors
    assert err.current.stream == (0, 0) and err.previous.stream == (0, side.stream_id)


def test_stream_set_through_torch_accelerator_is_seen(san):
    side = torch.npu.Stream()
    a = torch.ones(8, device="npu")
    side.wait_stream(torch.npu.current_stream())
    torch.accelerator.set_stream(side)
    try:
        b = a * 2
    finally:
        torch.accelerator.set_stream(torch.npu.default_stream())
    with pytest.raises(StreamSanitizerError, match=f"stream {side.stream_id:#x}"):
        b.sum()


def test_write_after_unsynchronized_read_is_flagged(san):
    side = torch.npu.Stream()
    a = torch.ones(8, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        a.sum()
    with pytest.raises(StreamSanitizerError, match="writing"):
        a.add_(1)


def test_view_at_offset_shares_the_storage(san):
    side = torch.npu.Stream()
    a = torch.zeros(2, 16, device="npu")
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        a[1].fill_(3)
    with pytest.raises(StreamSanitizerError):
        a[0].clone()   # another part of the same storage: tracked per storage, as the allocator frees it


def test_new_stream_is_not_ordered_after_earlier_work(san):
    a = torch.ones(8, device="npu")
    side = torch.npu.Stream()
    with torch.npu.stream(side), pytest.raises(StreamSanitizerError):
        a * 2


@pytest.mark.parametrize("order", [
    "wait_stream", "event_record_wait", "record_event_wait_event", "event_synchronize", "stream_synchronize",
    "device_synchronize", "blocking_copy_to_host", "item_on_side_stream", "wait_stream_on_plain_torch_stream",
])
def test_synchronized_program_passes(san, order):
    side, b = _produce_on_side_stream()
    cur = torch.npu.current_stream()
    if order == "wait_stream":
        cur.wait_stream(side)
    elif order == "event_record_wait":
        e = torch.npu.Event()
        e.record(side)
        e.wait()
    elif order == "record_event_wait_event":
        cur.wait_event(side.record_event())
    elif order == "event_synchronize":
        side.record_event().synchronize()
    elif order == "stream_synchronize":
        side.synchronize()
    elif order == "device_synchronize":
        torch.npu.synchronize()
    elif order == "blocking_copy_to_host":
        with torch.npu.stream(side):
            b.cpu()   # the host waited for the side stream
    elif order == "wait_stream_on_plain_torch_stream":   # torch.Stream objects from torch.accelerator & co.
        cur.wait_stream(torch.Stream(stream_id=side.stream_id, device_index=0, device_type=side.device_type))
    elif order == "item_on_side_stream":
        with torch.npu.stream(side):
            b.sum().item()
    assert b.sum().item() == 32 * 32 * 32


def test_waiting_then_reusing_on_the_side_stream_passes(san):
    side, b = _produce_on_side_stream()
    torch.npu.current_stream().wait_stream(side)
    c = b + 1
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        b.mul_(c)   # write after the default stream's read, ordered by the second wait_stream
    torch.npu.current_stream().wait_stream(side)
    assert b[0, 0].item() == 32 * 33


def test_event_recorded_before_the_write_does_not_order_it(san):
    side = torch.npu.Stream()
    a = torch.ones(8, device="npu")
    side.wait_stream(torch.npu.current_stream())
    early = side.record_event()
    with torch.npu.stream(side):
        a.add_(1)
    torch.npu.current_stream().wait_event(early)
    with pytest.raises(StreamSanitizerError):
        a.sum()


def test_disable_removes_the_mode():
    try:
        sanitizer.enable()
        assert any(isinstance(m, sanitizer.StreamSanitizerMode) for m in _get_current_dispatch_mode_stack())
        sanitizer.disable()
        assert _get_current_dispatch_mode_stack() == []
        torch.npu._sanitizer.enable_npu_sanitizer()  # the torch.cuda._sanitizer-style name
        assert sanitizer.is_enabled()
    finally:
        sanitizer.disable()
    assert not sanitizer.is_enabled() and _get_current_dispatch_mode_stack() == []


_ENV_PROBE = """
import sys, torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
print(len(_get_current_dispatch_mode_stack()), "npudist.device.sanitizer" in sys.modules)
if _get_current_dispatch_mode_stack():
    s = torch.npu.Stream(); a = torch.ones(4, device="npu"); s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        a.add_(1)
    try:
        a.sum()
    except torch.npu._sanitizer.StreamSanitizerError:
        print("flagged")
"""


@pytest.mark.parametrize("value,expected", [("1", "1 True\nflagged"), (None, "0 False")])
def test_environment_variable(value, expected):
    env = {k: v for k, v in os.environ.items() if k != "NPUDIST_STREAM_SANITIZER"}
    if value is not None:
        env["NPUDIST_STREAM_SANITIZER"] = value
    out = subprocess.run([sys.executable, "-c", _ENV_PROBE], env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_malformed_environment_variable_names_it():
    env = dict(os.environ, NPUDIST_STREAM_SANITIZER="maybe", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", "import torch, npudist"], env=env, capture_output=True, text=True,
                         timeout=90)
    assert out.returncode != 0 and "NPUDIST_STREAM_SANITIZER='maybe' is not a boolean" in out.stderr, out.stderr
