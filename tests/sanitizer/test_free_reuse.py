"""The npu stream sanitizer's deallocation check: the host frees a tensor that a kernel on another stream used,
without record_stream or an ordering of the allocation stream after that use; the allocation stream's next
allocation may get the block while that kernel is still to run. Reported with the tensor, both streams and the
stacks of the access and of the free; record_stream / wait_stream / an event make the same program pass; a free
on the stream that used the tensor is never reported. The same-stream reuse itself (the first kernel reads its
data intact) is tests/device/test_stream_ordered_reuse.py."""
import os
import subprocess
import sys
import time

import pytest
import torch

from npudist import _C
from npudist.device import kernel_queue, sanitizer, sync_trace
from npudist.device.sanitizer import StreamSanitizerError, UnsynchronizedFreeError

pytestmark = pytest.mark.timeout(120)


def _read_on_side(x):
    """A kernel on a new side stream reads ``x`` (the side stream first waits for x's creation)."""
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        y = x * 2  # SIDE-READ
    return side, y


def _let_side_release(side, y):
    """Let the side stream's kernels run and the launch queue release what they held (a block of another stream
    is freed only then under asynchronous launch), without an ordering the sanitizer would see: a later
    allocation then finds the block in its pool on either launch mode."""
    while not side.query():
        time.sleep(0.001)
    with torch.npu.stream(side):
        y.add_(0)  # a launch: releases the kernels that ran


def test_free_then_reuse_across_streams_is_reported(san):
    x = torch.arange(8, dtype=torch.float32, device="npu")
    side, y = _read_on_side(x)
    ptr = x.data_ptr()
    del x  # FREE
    _let_side_release(side, y)
    with pytest.raises(StreamSanitizerError) as info:
        torch.full((8,), 7.0, device="npu")  # REUSE: the default stream's next small allocation may get x's block
    (err,) = info.value.errors
    assert isinstance(err, UnsynchronizedFreeError)
    assert err.storage_ptr == ptr and err.owner == (0, 0) and err.previous.stream == (0, side.stream_id)
    assert err.reuse.stream == (0, 0) and err.reuse.op == "aten.full.default"
    msg = str(info.value)
    assert f"storage {ptr:#x} freed while another stream may still access it" in msg
    assert f"tensor(shape=(8,), dtype=torch.float32, data_ptr={ptr:#x})" in msg
    assert "(default stream)" in msg and f"stream {side.stream_id:#x}" in msg and "aten.mul" in msg
    assert "y = x * 2  # SIDE-READ" in msg and "# REUSE" in msg  # the access's and the reuse's stacks
    free_stack = "".join(err.stack.format())
    # Blocking launch frees at `del x`; under asynchronous launch the queued side kernel holds the default
    # stream's block until the launch queue releases it (the side stream's next launch).
    assert "del x  # FREE" in free_stack or (not kernel_queue.is_blocking() and "y.add_(0)" in free_stack), \
        free_stack
    assert "sanitizer.py" not in free_stack and "sync_trace.py" not in free_stack
    assert f"record_stream(npu:0 stream {side.stream_id:#x})" in msg  # the fix names the stream
    torch.npu.current_stream().wait_stream(side)
    assert torch.equal(y.cpu(), torch.arange(8, dtype=torch.float32) * 2)


def test_write_on_another_stream_then_free_then_reuse_is_reported(san):
    x = torch.zeros(4, device="npu")
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        x.add_(1)
        scratch = torch.zeros(1, device="npu")
    del x
    _let_side_release(side, scratch)
    with pytest.raises(StreamSanitizerError, match="writing it"):
        torch.ones(4, device="npu")


def test_reuse_from_the_other_pool_is_not_reported_until_one_from_the_same(san):
    x = torch.ones(8, device="npu")   # a small-pool block (<= 1 MiB)
    side, y = _read_on_side(x)
    del x
    _let_side_release(side, y)
    big = torch.zeros(2 << 20, dtype=torch.uint8, device="npu")  # the large pool cannot hand out x's block
    with pytest.raises(StreamSanitizerError, match="freed while another stream"):
        torch.zeros(8, device="npu")
    assert big.numel() == 2 << 20


def test_record_stream_before_the_use_does_not_cover_it(san):
    x = torch.ones(8, device="npu")
    side = torch.npu.Stream()
    x.record_stream(side)  # the side stream's position now: before the read below
    side.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(side):
        y = x.sum()
    del x
    _let_side_release(side, y)
    with pytest.raises(StreamSanitizerError, match="freed while another stream"):
        torch.ones(8, device="npu")


@pytest.mark.parametrize("order", ["record_stream", "wait_stream", "event", "stream_synchronize",
                                   "wait_stream_after_the_free"])
def test_ordered_free_passes(san, order):
    x = torch.arange(8, dtype=torch.float32, device="npu")
    side, y = _read_on_side(x)
    if order == "record_stream":
        x.record_stream(side)  # the block is reused only once the side stream passed its read
    elif order == "wait_stream":
        torch.npu.current_stream().wait_stream(side)
    elif order == "event":
        torch.npu.current_stream().wait_event(side.record_event())
    elif order == "stream_synchronize":
        side.synchronize()
    del x
    _let_side_release(side, y)
    if order == "wait_stream_after_the_free":   # FSDP2's pattern: ordered before the stream allocates again
        torch.npu.current_stream().wait_stream(side)
    z = torch.full((8,), 7.0, device="npu")
    torch.npu.synchronize()
    assert torch.equal(z.cpu(), torch.full((8,), 7.0))
    assert torch.equal(y.cpu(), torch.arange(8, dtype=torch.float32) * 2)


def test_same_stream_free_is_never_reported(san):
    x = torch.ones(8, device="npu")
    y = x * 2  # read on the stream x was allocated on
    del x
    z = torch.empty(8, device="npu")
    z.fill_(1.0)
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        a = torch.ones(8, device="npu")  # allocated, written and read on the side stream only
        b = a + 1
        del a
        torch.empty(8, device="npu").fill_(0.0)
    torch.npu.synchronize()
    assert b.sum().item() == 16 and y.sum().item() == 16


def test_free_hook_is_set_only_while_the_sanitizer_is_on():
    assert _C._npu_freeHook() is None and not sync_trace.free_hooks  # the free path reads a null pointer
    sanitizer.enable()
    try:
        assert _C._npu_freeHook() is sync_trace._on_free
    finally:
        sanitizer.disable()
    assert _C._npu_freeHook() is None and not sync_trace.free_hooks


def test_free_hook_gets_the_block_and_its_stream():
    freed = []
    remove = sync_trace.register_free_hook(lambda ptr, stream: freed.append((ptr, stream)))
    try:
        side = torch.npu.Stream()
        with torch.npu.stream(side):
            x = torch.empty(16, device="npu")
        ptr = x.data_ptr()
        del x  # never used by a kernel: freed here, into the side stream's pool
        assert [f for f in freed if f[0] == ptr] == [(ptr, side.stream_id)]
        torch.empty(0, device="npu")  # no block: nothing freed
        assert all(p != 0 for p, _ in freed)
    finally:
        remove()
    assert _C._npu_freeHook() is None
    seen = len(freed)
    torch.empty(4, device="npu")
    assert len(freed) == seen


def test_set_free_hook_rejects_a_non_callable():
    with pytest.raises(TypeError, match="expected a callable"):
        _C._npu_setFreeHook(3)


_SHUTDOWN = """
import threading, torch
from npudist.device import sanitizer
sanitizer.enable()
keep = [torch.ones(64, device="npu") for _ in range(4)]       # freed while the interpreter shuts down
side = torch.npu.Stream()
side.wait_stream(torch.npu.current_stream())
with torch.npu.stream(side):
    held = keep[0] * 2   # keep[0]'s free at exit is racy: its report has no next op to be raised by
t = threading.Thread(target=lambda: [torch.ones(8, device="npu") for _ in range(20)])  # frees on another thread
t.start(); t.join()
print("done")
"""


def test_frees_at_interpreter_shutdown_and_on_other_threads_do_not_crash():
    env = dict(os.environ)
    env.pop("NPUDIST_STREAM_SANITIZER", None)
    out = subprocess.run([sys.executable, "-c", _SHUTDOWN], env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    assert "Exception ignored" not in out.stderr and "Fatal" not in out.stderr, out.stderr
