"""Stream-ordered reuse under asynchronous launch (docs/memory.md, "Stream-ordered reuse"): a tensor the host drops
while kernels that use it are still queued gives its block back to its stream's pool at once; the stream's next
allocation gets it, and the work written there runs after the queued kernels because the stream runs in order.
Other streams and empty_cache are checked too. A host "gate" (tests/runtime_ext) holds a
stream closed, so what is queued behind it provably has not run until the gate opens."""
import threading

import pytest
import torch

from npudist.device import kernel_queue
from runtime_ext import HostGate

needs_async = pytest.mark.skipif(kernel_queue.is_blocking(), reason="ASCEND_LAUNCH_BLOCKING=1 selected blocking launch")

N = 64 * 1024  # 256 KiB of fp32: above the inline size, so every kernel below is queued behind the gate


def _warm(x):
    """First runs of the signatures used below (a new signature runs synchronously once)."""
    (x * 2).fill_(7.0)
    torch.npu.synchronize()


@needs_async
def test_block_freed_while_queued_is_reused_by_its_stream_and_read_intact():
    x = torch.arange(N, dtype=torch.float32, device="npu")
    expected = torch.arange(N, dtype=torch.float32) * 2
    _warm(x)
    stream = torch.npu.current_stream()
    with HostGate(0, stream.stream_id):
        kernel_queue.reset_launch_counts()
        y = x * 2  # queued: reads x once the gate opens
        old = x.data_ptr()
        del x  # the host drops x while the kernel reading it is queued
        z = torch.empty(N, device="npu")  # the stream's next allocation of that size: x's block
        assert z.data_ptr() == old
        z.fill_(7.0)  # queued after the read of x: overwrites the block only once the read ran
        assert kernel_queue.launch_counts()["queued"] == 2
        assert not stream.query()
    torch.npu.synchronize()
    assert torch.equal(y.cpu(), expected)  # the first kernel read x's data intact
    assert torch.equal(z.cpu(), torch.full((N,), 7.0))


@needs_async
def test_queued_kernels_hold_no_memory_of_their_stream():
    x = torch.ones(N, device="npu")
    _warm(x)
    stream = torch.npu.current_stream()
    base = torch.npu.memory_allocated()
    with HostGate(0, stream.stream_id):
        for _ in range(20):
            x = x * 2  # each step drops the previous result while the kernel that reads it is still queued
        # two blocks in turn, as under blocking launch, not one per queued kernel
        assert torch.npu.memory_allocated() == base
        assert not stream.query()
    torch.npu.synchronize()
    assert torch.equal(x.cpu(), torch.full((N,), 2.0 ** 20))


@needs_async
def test_another_streams_use_is_recorded_as_record_stream_does():
    """A kernel queued on a side stream that reads a block of the default stream records that use, as
    ``record_stream(side)`` would: the host's free lowers memory_allocated at once (nothing holds the block),
    yet the default stream's next allocation cannot get the block until the side stream ran the read."""
    side = torch.npu.Stream()
    x = torch.full((N,), 3.0, device="npu")
    _warm(x)
    with HostGate(0, side.stream_id):
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            y = x * 2
        old = x.data_ptr()
        before = torch.npu.memory_allocated()
        del x
        assert torch.npu.memory_allocated() == before - N * 4  # freed, as after record_stream on CUDA
        other = torch.empty(N, device="npu")
        assert other.data_ptr() != old  # but not reused while the side stream's read is queued
        other.fill_(1.0)
        assert not side.query()
    torch.npu.synchronize()
    assert torch.equal(y.cpu(), torch.full((N,), 6.0))
    again = torch.empty(N, device="npu")  # the read ran: the block serves its stream again
    assert again.data_ptr() == old


@needs_async
def test_storage_resized_to_zero_while_read_frees_its_block_at_once():
    """FSDP frees an unsharded parameter with ``untyped_storage().resize_(0)`` right after its last use: the
    block goes back to the pool at once, as under blocking launch, and the queued kernel still reads it intact
    (later work on the stream runs after it). Growing a storage queues the copy of its old bytes the same way."""
    x = torch.arange(N, dtype=torch.float32, device="npu")
    g = torch.arange(N, dtype=torch.float32, device="npu")  # before the gate: arange drains its stream
    _warm(x)
    stream = torch.npu.current_stream()
    with HostGate(0, stream.stream_id):
        y = x * 2  # queued: reads x once the gate opens
        before = torch.npu.memory_allocated()
        x.untyped_storage().resize_(0)
        assert torch.npu.memory_allocated() == before - N * 4
        z = torch.empty(N, device="npu")
        z.fill_(7.0)  # likely in x's old block: queued behind the read
        g.untyped_storage().resize_(2 * N * 4)  # the copy of the old bytes is queued too
        assert not stream.query()
    torch.npu.synchronize()
    assert torch.equal(y.cpu(), torch.arange(N, dtype=torch.float32) * 2)
    assert torch.equal(z.cpu(), torch.full((N,), 7.0))
    assert torch.equal(g.cpu(), torch.arange(N, dtype=torch.float32))


@needs_async
def test_empty_cache_waits_for_kernels_queued_on_freed_blocks():
    x = torch.arange(N, dtype=torch.float32, device="npu")
    _warm(x)
    stream = torch.npu.current_stream()
    gate = HostGate(0, stream.stream_id)
    try:
        y = x * 2
        del x  # back in the pool, still to be read by the queued kernel
        timer = threading.Timer(0.2, gate.open)
        timer.start()
        torch.npu.empty_cache()  # returns segments to the device only once the stream ran the read
        assert stream.query()
    finally:
        gate.open()
    assert torch.equal(y.cpu(), torch.arange(N, dtype=torch.float32) * 2)
