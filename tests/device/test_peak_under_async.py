"""Peak memory under asynchronous launch (docs/memory.md, "Peak memory"): work queued on another stream may hold
memory the host has dropped; an allocation that would raise max_memory_allocated first lets the device catch up
(bounded) so the peak is the one blocking launch reaches. Each case runs in a fresh interpreter: memory caching
off (PYTORCH_NO_NPU_MEMORY_CACHING, read once per process) is what makes a queued kernel hold its arguments."""
import os
import sys

import pytest
import torch  # noqa: F401  (before npudist: torch's autoload registers the npu device)

from npudist.device import kernel_queue

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "allocator"))
from _subproc import check_snippet  # noqa: E402

needs_async = pytest.mark.skipif(kernel_queue.is_blocking(), reason="ASCEND_LAUNCH_BLOCKING=1 selected blocking launch")

_PRELUDE = """
import sys, threading
sys.path.insert(0, "tests")
import torch, npudist
from runtime_ext import HostGate
N = 64 * 1024  # 256 KiB of fp32: queued, not run inline
MiB = 1 << 20
x = torch.full((N,), 3.0, device="npu")
(x * 2).fill_(1.0)  # first runs of the signatures (a new signature runs synchronously once)
torch.npu.synchronize()
side = torch.npu.Stream()
"""


@needs_async
def test_memory_held_by_another_streams_work_is_released_before_a_new_peak():
    out = check_snippet(_PRELUDE + """
gate = HostGate(0, side.stream_id)
side.wait_stream(torch.npu.current_stream())
with torch.npu.stream(side):
    y = x * 2            # queued behind the gate; caching off: the kernel holds x's memory
del x                    # the host drops x; blocking launch would have freed it by now
torch.npu.reset_peak_memory_stats()
base = torch.npu.memory_allocated()   # still counts x: held by the queued kernel
threading.Timer(0.05, gate.open).start()
z = torch.empty(N, device="npu")      # would raise the peak: waits for the side stream, x goes first
print("peak_over_base", torch.npu.max_memory_allocated() - base)
print("side_done", side.query())
torch.npu.synchronize()
print("y_ok", torch.equal(y.cpu(), torch.full((N,), 6.0)))
""", env={"PYTORCH_NO_NPU_MEMORY_CACHING": "1"})
    got = dict(line.split() for line in out.split("\n") if line.strip())
    # z took x's place: the peak did not grow (without the wait it would be base + N * 4).
    assert int(got["peak_over_base"]) == 0, out
    assert got["side_done"] == "True" and got["y_ok"] == "True", out


@needs_async
def test_a_new_peak_does_not_wait_forever_for_a_stream_that_waits_for_the_host():
    """The side stream waits for something only this thread will do later: the allocation waits a bounded
    time, then allocates above the peak; the program completes."""
    out = check_snippet(_PRELUDE + """
gate = HostGate(0, side.stream_id)
with torch.npu.stream(side):
    y = x * 2
del x
torch.npu.reset_peak_memory_stats()
base = torch.npu.memory_allocated()
z = torch.empty(N, device="npu")      # the gate opens only below: the wait must give up
print("peak_over_base", torch.npu.max_memory_allocated() - base)
print("side_done", side.query())
gate.open()
torch.npu.synchronize()
print("y_ok", torch.equal(y.cpu(), torch.full((N,), 6.0)))
""", env={"PYTORCH_NO_NPU_MEMORY_CACHING": "1"}, timeout=60)
    got = dict(line.split() for line in out.split("\n") if line.strip())
    assert int(got["peak_over_base"]) == 64 * 1024 * 4, out  # x still held: z is on top
    assert got["side_done"] == "False" and got["y_ok"] == "True", out
