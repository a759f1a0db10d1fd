"""Asynchronous launch: npu ops queue their kernels on the current stream and return; synchronization points
wait; ASCEND_LAUNCH_BLOCKING=1 restores synchronous ops; results are bitwise equal in both modes.

Asynchrony is shown without timing: a host "gate" (tests/runtime_ext) holds a stream closed, so whatever
was queued behind it provably has not run until the test opens it. An op signature runs synchronously the
first time (its Meta inference is verified against the CPU kernel), so each test runs its ops once first."""
import gc
import json
import threading

import pytest
import torch

from npudist.device import kernel_queue
from runtime_ext import HostGate

from .conftest import run_python

# In-process tests need asynchronous launch (the default; the CI's second run sets ASCEND_LAUNCH_BLOCKING=1); the
# subprocess tests choose their mode themselves.
needs_async = pytest.mark.skipif(kernel_queue.is_blocking(), reason="ASCEND_LAUNCH_BLOCKING=1 selected blocking launch")


@needs_async
def test_launch_returns_before_the_kernel_ran():
    a = torch.randn(64, 64, device="npu")
    expected = (a.cpu() @ a.cpu()) @ a.cpu()
    (a @ a) @ a  # first run of the signature: synchronous
    torch.npu.synchronize()
    stream = torch.npu.current_stream()
    with HostGate(0, stream.stream_id):
        kernel_queue.reset_launch_counts()
        b = (a @ a) @ a  # returns although the stream is held: the matmuls are queued behind the gate
        assert kernel_queue.launch_counts()["queued"] == 2
        assert not stream.query()
    torch.npu.synchronize()
    assert stream.query()
    assert torch.equal(b.cpu(), expected)


@needs_async
def test_queued_kernels_run_under_the_launchers_inference_mode():
    """A queued kernel runs under the thread-local state it was launched with: inside torch.inference_mode() its
    CPU ops may update inference tensors in place (on the worker without that state they raise "Inplace update to
    inference tensor outside InferenceMode")."""
    x = torch.randn(64, 64, device="npu")
    expected_nan = torch.isnan(x.cpu())
    with torch.inference_mode():
        y = torch.zeros(64, 64, device="npu")
        # first run of both signatures: synchronous (behind the gate it would wait out the gate's 60 s)
        torch.isnan(x)
        y.add_(x)
        torch.npu.synchronize()
        stream = torch.npu.current_stream()
        with HostGate(0, stream.stream_id):
            kernel_queue.reset_launch_counts()
            flags = [torch.isnan(x) for _ in range(8)]
            for _ in range(8):
                y.add_(x)
            assert kernel_queue.launch_counts()["queued"] == 16  # all of them ran on the worker
            assert not stream.query()
        torch.npu.synchronize()
    assert all(torch.equal(f.cpu(), expected_nan) for f in flags)
    assert torch.equal(y.cpu(), sum([x.cpu()] * 9, torch.zeros(64, 64)))
    # the worker's own state is restored after the kernel: a queued kernel launched outside inference mode
    # on an ordinary tensor still records autograd history as usual
    w = torch.ones(4, device="npu", requires_grad=True)
    (w * 2).sum().backward()
    assert torch.equal(w.grad.cpu(), torch.full((4,), 2.0))


@needs_async
def test_queued_kernels_follow_every_change_of_the_launchers_state():
    """Launches alternate between inference mode and ordinary mode, all queued behind a gate. A state that holds
    no Python object is shared between launches while nothing changes, and the worker keeps it installed
    (launch_state.h); each kernel must still run under its own launcher's state: an in-place update of an
    inference tensor run under the ordinary state raises at the synchronize."""
    x = torch.randn(64, 64, device="npu")
    with torch.inference_mode():
        y = torch.zeros(64, 64, device="npu")
        y.add_(x)  # first runs of the signature: synchronous
    z = torch.zeros(64, 64, device="npu")
    z.add_(x)
    torch.npu.synchronize()
    stream = torch.npu.current_stream()
    with HostGate(0, stream.stream_id):
        kernel_queue.reset_launch_counts()
        for _ in range(6):
            with torch.inference_mode():
                y.add_(x)
            z.add_(x)
        assert kernel_queue.launch_counts()["queued"] == 12
    torch.npu.synchronize()
    expected = sum([x.cpu()] * 7, torch.zeros(64, 64))
    assert torch.equal(y.cpu(), expected) and torch.equal(z.cpu(), expected)
    assert not torch.is_inference_mode_enabled()


@needs_async
def test_queued_kernels_run_under_the_launchers_autocast():
    """Under torch.autocast("npu") a queued matmul computes in the autocast dtype and its result equals the same
    op under CPU autocast bit for bit; the state (at::ThreadLocalState) is the launcher's, restored afterwards."""
    x = torch.randn(64, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = x @ x
    xn = x.to("npu")
    with torch.autocast("npu", dtype=torch.bfloat16):
        xn @ xn  # first run of the signature: synchronous
        torch.npu.synchronize()
        stream = torch.npu.current_stream()
        with HostGate(0, stream.stream_id):
            kernel_queue.reset_launch_counts()
            outs = [xn @ xn for _ in range(4)]
            assert kernel_queue.launch_counts()["queued"] >= 4  # the matmuls (and autocast's casts) are queued
        torch.npu.synchronize()
    assert all(o.dtype == torch.bfloat16 and torch.equal(o.cpu(), expected) for o in outs)
    assert (xn @ xn).dtype == torch.float32  # outside autocast again


@needs_async
def test_sync_points_wait_for_queued_kernels():
    x = torch.arange(6, dtype=torch.float32, device="npu")
    (x * 3 + 1).sum()
    stream = torch.npu.current_stream()
    gate = HostGate(0, stream.stream_id)
    y = x * 3 + 1
    timer = threading.Timer(0.2, gate.open)  # .item()/.cpu() below must wait for it
    timer.start()
    try:
        assert y[5].item() == 16.0
        assert y.tolist() == [1.0, 4.0, 7.0, 10.0, 13.0, 16.0]
    finally:
        timer.join()
        gate.open()
    with HostGate(0, stream.stream_id) as g:
        z = y.sum()
        threading.Timer(0.1, g.open).start()
        assert torch.equal(z.cpu(), torch.tensor(51.0))


@needs_async
def test_wait_stream_orders_queues_without_blocking_the_host():
    side = torch.npu.Stream()
    x = torch.full((8,), 2.0, device="npu")
    x * 5 + 1
    torch.npu.synchronize()
    with HostGate(0, side.stream_id) as gate:
        with torch.npu.stream(side):
            y = x * 5  # queued behind the gate on `side`
        torch.npu.current_stream().wait_stream(side)  # returns: the default stream's queue waits instead
        z = y + 1
        assert not side.query() and not torch.npu.current_stream().query()
        gate.open()
    torch.npu.current_stream().synchronize()
    assert torch.equal(z.cpu(), torch.full((8,), 11.0))


@needs_async
def test_freed_block_is_not_reused_by_another_stream_while_a_queued_kernel_uses_it():
    side = torch.npu.Stream()
    x = torch.full((1024,), 3.0, device="npu")
    x * 2
    torch.npu.synchronize()
    with HostGate(0, side.stream_id) as gate:
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            y = x * 2  # reads x once the gate opens
        x.record_stream(side)
        old = x.data_ptr()
        del x
        other = torch.zeros(1024, device="npu")  # default stream: must not get x's block
        assert other.data_ptr() != old
        gate.open()
    side.synchronize()
    assert torch.equal(y.cpu(), torch.full((1024,), 6.0))


@needs_async
def test_h2d_copy_snapshots_the_pageable_source():
    src = torch.arange(16, dtype=torch.float32)
    dst = src.to("npu", non_blocking=True)
    src.fill_(-1)
    assert torch.equal(dst.cpu(), torch.arange(16, dtype=torch.float32))


@needs_async
def test_non_blocking_copies_with_pinned_memory_are_queued():
    """A non_blocking copy between npu and pinned host memory is queued on the current stream (as
    cudaMemcpyAsync): with the stream held it has not run yet, and after a synchronize it has, in stream order
    after the kernel that produced its source. A pageable host side keeps the synchronous copy."""
    a = torch.full((256,), 2.0, device="npu")
    (a * 3).cpu()  # the signature's synchronous first run
    pinned = torch.zeros(256, pin_memory=True)
    with HostGate(0, 0) as gate:
        kernel_queue.reset_launch_counts()
        pinned.copy_(a * 3, non_blocking=True)
        counts = kernel_queue.launch_counts()
        assert counts["queued"] == 2 and counts["synchronous"] == 0, counts
        assert torch.equal(pinned, torch.zeros(256))  # not run: the stream is held
        gate.open()
    torch.npu.synchronize()
    assert torch.equal(pinned, torch.full((256,), 6.0))
    back = torch.empty(256, device="npu")
    back.copy_(pinned, non_blocking=True)
    assert torch.equal(back.cpu(), torch.full((256,), 6.0))
    kernel_queue.reset_launch_counts()
    pageable = torch.zeros(256)
    pageable.copy_(a, non_blocking=True)
    assert kernel_queue.launch_counts()["synchronous"] == 1 and torch.equal(pageable, torch.full((256,), 2.0))


@needs_async
def test_kernel_error_surfaces_at_the_next_sync_naming_op_and_line():
    x = torch.randn(3, 4, device="npu")
    bad = torch.tensor([0, 7], device="npu")  # out of range: only the kernel can tell
    torch.index_select(x, 0, torch.tensor([0, 2], device="npu"))  # the signature's synchronous first run
    torch.npu.synchronize()
    y = torch.index_select(x, 0, bad)  # LAUNCH LINE
    line = next(i for i, s in enumerate(open(__file__).read().splitlines(), 1) if s.endswith("# LAUNCH LINE"))
    with pytest.raises(RuntimeError) as info:
        torch.npu.synchronize()
    msg = str(info.value)
    assert "aten::index_select" in msg and f"test_async_launch.py:{line}" in msg and "out of range" in msg
    torch.npu.synchronize()  # reported once
    del y


@needs_async
def test_data_dependent_and_scalar_ops_run_synchronously():
    x = torch.tensor([0.0, 1.5, 0.0, 2.0], device="npu")
    for _ in range(2):  # also once the signatures are known
        kernel_queue.reset_launch_counts()
        nz = torch.nonzero(x)
        sel = x[x > 0]
        assert kernel_queue.launch_counts()["synchronous"] >= 2
    assert torch.equal(nz.cpu(), torch.tensor([[1], [3]])) and torch.equal(sel.cpu(), torch.tensor([1.5, 2.0]))


def test_blocking_env_makes_every_op_synchronous():
    code = """
import torch, npudist
from npudist.device import kernel_queue
from runtime_ext import HostGate
assert kernel_queue.is_blocking()
a = torch.randn(32, 32, device='npu')
with HostGate(0, 0):
    kernel_queue.reset_launch_counts()
    b = a @ a + 1  # runs now, although the stream is held
    assert torch.equal(b.cpu(), a.cpu() @ a.cpu() + 1)  # (no drain in blocking mode)
    assert kernel_queue.launch_counts()['queued'] == 0
print('ok')
"""
    for env in ({"ASCEND_LAUNCH_BLOCKING": "1", "NPUDIST_LAUNCH_BLOCKING": "1"}, {"NPUDIST_LAUNCH_BLOCKING": "1"}):
        res = run_python(code, env={**env, "PYTHONPATH": "tests"}, timeout=120)
        assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


TRAIN = """
import json, sys, torch, torch.nn as nn, torch.nn.functional as F
import npudist
torch.manual_seed(0); torch.npu.manual_seed(0)
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 32); self.ln = nn.LayerNorm(32); self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 32)); self.rms = nn.RMSNorm(32)
        self.head = nn.Linear(32, 50)
    def forward(self, t):
        h = self.emb(t); a, _ = self.attn(self.ln(h), self.ln(h), self.ln(h), need_weights=False)
        h = h + a; h = h + self.ff(self.rms(h)); return self.head(h)
m = Block().to('npu'); opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
data = torch.randint(0, 50, (4, 9))
losses = []
for step in range(3):
    t = data.to('npu'); logits = m(t[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 50), t[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward(); nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step()
    losses.append(loss.detach())
state = {k: v.cpu() for k, v in m.state_dict().items()}
torch.save({'losses': torch.stack(losses).cpu(), 'state': state}, sys.argv[1])
print(json.dumps(npudist.device.kernel_queue.launch_counts()))
"""


def test_training_is_bitwise_equal_in_both_modes(tmp_path):
    results = {}
    for blocking in ("0", "1"):
        out = tmp_path / f"blocking{blocking}.pt"
        code = f"import sys; sys.argv = ['x', {str(out)!r}]\n" + TRAIN
        res = run_python(code, env={"ASCEND_LAUNCH_BLOCKING": blocking, "NPUDIST_LAUNCH_BLOCKING": blocking}, timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        results[blocking] = (torch.load(out), json.loads(res.stdout.strip().splitlines()[-1]))
    (a, counts_async), (b, counts_blocking) = results["0"], results["1"]
    assert torch.equal(a["losses"], b["losses"])
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        assert torch.equal(a["state"][k], b["state"][k]), k
    assert counts_blocking["queued"] == 0 and counts_async["queued"] > counts_async["synchronous"]


def test_fork_and_exit_with_queued_kernels():
    # Small tensors: an op over more than ATen's grain size uses OpenMP, and GNU OpenMP used before a fork hangs
    # the child's next parallel region (with or without npudist; fork after OpenMP is unsupported by libgomp).
    code = """
import os, torch, npudist
a = torch.randn(64, 64, device='npu')
b = a
for _ in range(20):
    b = b @ a / 8
pid = os.fork()  # drains first: the child sees the finished result
if pid == 0:
    os._exit(0 if torch.isfinite(b).all().item() else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
for _ in range(20):
    b = b @ a / 8
print('exit with a non-empty queue')
"""
    res = run_python(code, env={"ASCEND_LAUNCH_BLOCKING": "0", "NPUDIST_LAUNCH_BLOCKING": "0"}, timeout=120)
    assert res.returncode == 0 and "exit with" in res.stdout, res.stderr[-3000:]


def test_launch_waits_when_the_stream_queue_is_full():
    """NPUDIST_LAUNCH_QUEUE_DEPTH bounds how far the host runs ahead: with the stream held and a depth of 4, a
    launching thread queues 4 kernels and then waits until the stream ran half of them; a malformed depth is a
    ValueError naming the variable."""
    code = """
import threading, time, torch, npudist
from npudist.device import kernel_queue
from runtime_ext import HostGate
x = torch.ones(8, device='npu')
(x + 1) * 2  # first run of each signature: synchronous
torch.npu.synchronize()
outs = []
def launch_ten():
    for _ in range(10):
        outs.append(x + 1)
with HostGate(0, 0) as gate:
    kernel_queue.reset_launch_counts()
    t = threading.Thread(target=launch_ten)
    t.start()
    time.sleep(0.5)
    assert t.is_alive() and len(outs) == 4 and kernel_queue.launch_counts()['queued'] == 4, (len(outs), kernel_queue.launch_counts())
    gate.open()
    t.join(30)
    assert not t.is_alive() and len(outs) == 10
assert all(torch.equal(o.cpu(), torch.full((8,), 2.0)) for o in outs)
print('ok')
"""
    res = run_python(code, env={"NPUDIST_LAUNCH_QUEUE_DEPTH": "4", "ASCEND_LAUNCH_BLOCKING": "0", "NPUDIST_LAUNCH_BLOCKING": "0",
                                "PYTHONPATH": "tests"}, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]
    res = run_python("import torch, npudist\ntorch.ones(1, device='npu')", env={"NPUDIST_LAUNCH_QUEUE_DEPTH": "many"})
    assert res.returncode != 0 and "NPUDIST_LAUNCH_QUEUE_DEPTH='many' is not a queue depth" in res.stderr, res.stderr[-3000:]


def test_launch_window_counts_kernels_whatever_they_hold():
    """The launch window counts kernels only (docs/device.md, "Launch window"): with the stream held, 12
    memory-bound adds of 1 MiB outputs and 6 matmuls of 4 MiB outputs all queue (their outputs, 28 MiB, are more
    than a tenth of the 256 MiB device) without the launching thread waiting; with NPUDIST_LAUNCH_QUEUE_DEPTH=8
    the ninth kernel waits, whatever its kind. Released, every result is right."""
    code = """
import os, threading, time, torch, npudist
from npudist.device import kernel_queue
from runtime_ext import HostGate
torch.set_num_threads(1)
x = torch.ones(256 * 1024, device='npu')
a = torch.eye(1024, device='npu')
for _ in range(5):  # the first run is synchronous; the next ones are queued
    x + 1, a @ a + 1
torch.npu.synchronize()
def queued_before_wait(fn, n):
    outs = []
    with HostGate(0, 0) as gate:
        kernel_queue.reset_launch_counts()
        t = threading.Thread(target=lambda: outs.extend(fn() for _ in range(n)))
        t.start()
        t.join(0.5)
        alive, queued = t.is_alive(), kernel_queue.launch_counts()['queued']
        gate.open()
        t.join(60)
    assert not t.is_alive() and len(outs) == n
    return alive, queued, outs
depth = int(os.environ.get('NPUDIST_LAUNCH_QUEUE_DEPTH', '1024'))
# (launch, calls, kernels per call, result): memory-bound, compute-bound, and both mixed
for fn, n, k, expected in ((lambda: x + 1, 12, 1, torch.full((256 * 1024,), 2.0)), (lambda: a @ a, 6, 1, torch.eye(1024)),
                           (lambda: a @ a + 1, 6, 2, torch.eye(1024) + 1)):
    alive, queued, outs = queued_before_wait(fn, n)
    assert (alive, queued) == ((True, depth) if depth < n * k else (False, n * k)), (alive, queued, depth)
    assert all(torch.equal(o.cpu(), expected) for o in outs)
print('ok')
"""
    for depth in ("1024", "4"):
        res = run_python(code, env={"NPUDIST_DEVICE_MEMORY": "256MiB", "ASCEND_LAUNCH_BLOCKING": "0",
                                    "NPUDIST_LAUNCH_BLOCKING": "0", "NPUDIST_LAUNCH_QUEUE_DEPTH": depth,
                                    "PYTHONPATH": "tests"}, timeout=180)
        assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


@needs_async
def test_a_float_argument_that_changes_every_call_stays_queued():
    # Adam's addcdiv_ takes a new step size each step: after the first call of the signature, later calls with
    # other values queue (no drain) and compute with their own value.
    p, a, b = (torch.rand(16) + 0.5 for _ in range(3))
    pn = p.to("npu")
    an, bn = a.to("npu"), b.to("npu")
    pn.addcdiv_(an, bn, value=0.1)
    p.addcdiv_(a, b, value=0.1)
    torch.npu.synchronize()
    kernel_queue.reset_launch_counts()
    for step in range(1, 6):
        pn.addcdiv_(an, bn, value=-0.01 * step)
        p.addcdiv_(a, b, value=-0.01 * step)
    assert kernel_queue.launch_counts()["synchronous"] == 0 and kernel_queue.launch_counts()["queued"] == 5
    assert torch.equal(pn.cpu(), p)


def test_synchronize_releases_what_finished_kernels_held():
    """A task that ran is destroyed by the host (launch.h, release_finished), not by the worker: a
    synchronization point releases it, so an argument freed by the caller is back in the allocator by then."""
    a = torch.randn(256, 256, device="npu")
    a * 2  # first run of the signature: synchronous
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    x = torch.randn(256, 256, device="npu")
    y = x * 2
    del x  # the queued kernel still holds x's block
    torch.npu.synchronize()
    assert torch.npu.memory_allocated() == base + y.untyped_storage().nbytes()


def test_an_allocation_that_would_run_out_releases_finished_kernels_and_retries():
    """A finished kernel holds memory outside the caching allocator's pools (here: caching off) until the host
    next launches or synchronizes (pool blocks it does not hold: docs/memory.md, "Stream-ordered reuse"); an
    allocation that would fail before then releases it and retries instead of raising OutOfMemoryError. The
    allocation runs on a thread that never launched, which does not wait before a new peak (docs/memory.md,
    "Peak memory"), so the out-of-memory path is the one that releases."""
    code = """
import threading, time, torch, npudist
n = 6 * 2**20  # 24 MiB of float32; the device has 64 MiB
side = torch.npu.Stream()
w = torch.ones(n, device='npu')
with torch.npu.stream(side):
    v = w + 1  # first run of each signature: synchronous
del w, v
torch.npu.synchronize()
x = torch.ones(n, device='npu')
side.wait_stream(torch.npu.current_stream())
with torch.npu.stream(side):
    y = x + 1
del x  # caching off: the kernel queued on `side` holds x's memory
while not side.query():  # the kernel ran; query() releases nothing
    time.sleep(0.001)
assert torch.npu.memory_allocated() == 2 * n * 4, torch.npu.memory_allocated()  # x: still held by the finished task
out = []
t = threading.Thread(target=lambda: out.append(torch.empty(n, device='npu')))  # x + y + z would not fit
t.start(); t.join()
assert out, 'the allocation raised'
assert torch.npu.memory_allocated() == 2 * n * 4, torch.npu.memory_allocated()
assert torch.equal(y.cpu(), torch.full((n,), 2.0))
print('ok')
"""
    res = run_python(code, env={"NPUDIST_DEVICE_MEMORY": "64MiB", "ASCEND_LAUNCH_BLOCKING": "0",
                                "NPUDIST_LAUNCH_BLOCKING": "0", "PYTORCH_NO_NPU_MEMORY_CACHING": "1"}, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


def test_random_programs_on_threads_and_streams_match_cpu_and_give_memory_back():
    """Randomized: three threads, each on its own stream, run seeded random op chains while the main thread
    synchronizes and empties the cache at random; tasks launched by one thread are released by whichever thread
    launches or synchronizes next. Every result equals the same program on cpu, and after a synchronize the
    allocator holds exactly the live results."""
    import random
    import time

    ops = [
        lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x @ y, lambda x, y: torch.relu(x - y),
        lambda x, y: (x.sum(0, keepdim=True) + y) / 8, lambda x, y: torch.cat([x, y])[: x.shape[0]],
        lambda x, y: x.t().contiguous() - y, lambda x, y: torch.where(x > y, x, y),
    ]
    gc.collect()  # garbage of earlier tests, freed by a collection during this one, would skew the baseline
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    results, errors = {}, []

    def program(seed):
        try:
            rng = random.Random(seed)
            gen = torch.Generator().manual_seed(seed)
            stream = torch.npu.Stream()
            cpu = [torch.randn(16, 16, generator=gen) for _ in range(3)]
            with torch.npu.stream(stream):
                npu = [t.to("npu") for t in cpu]
                for _ in range(200):
                    i, j, k = rng.randrange(3), rng.randrange(3), rng.randrange(3)
                    op = rng.choice(ops)
                    cpu[k], npu[k] = op(cpu[i], cpu[j]).clamp(-4, 4), op(npu[i], npu[j]).clamp(-4, 4)  # finite
            stream.synchronize()
            results[seed] = (cpu, npu)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=program, args=(seed,)) for seed in (1, 2, 3)]
    for t in threads:
        t.start()
    rng = random.Random(0)
    while any(t.is_alive() for t in threads):
        rng.choice([torch.npu.synchronize, torch.npu.empty_cache, lambda: None])()
        time.sleep(0.001)
    for t in threads:
        t.join(60)
    assert not errors, errors
    live = 0
    for cpu, npu in results.values():
        for c, n in zip(cpu, npu):
            assert torch.equal(n.cpu(), c)
            live += n.untyped_storage().nbytes()
    torch.npu.synchronize()
    assert torch.npu.memory_allocated() == base + live


@needs_async
def test_npugraph_replay_is_queued_and_random_ops_keep_launch_order():
    """A replay is one queued task (a graph launch): it returns while the stream is held, runs in stream order,
    and its random ops take their numbers when the replay is launched: a replay followed by an eager random op
    gives the same numbers whether the stream runs them at once or only after being held."""
    static = torch.ones(256, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        out = torch.nn.functional.dropout(static * 2, 0.5)
    torch.npu.synchronize()
    stream = torch.npu.current_stream()
    torch.npu.manual_seed(7)
    g.replay()
    after = torch.rand(256, device="npu")
    expected = (out.cpu().clone(), after.cpu())
    torch.npu.manual_seed(7)
    with HostGate(0, stream.stream_id):
        static.fill_(1.0)
        g.replay()  # queued behind the gate
        after = torch.rand(256, device="npu")
        assert not stream.query()
    torch.npu.synchronize()
    assert torch.equal(out.cpu(), expected[0]) and torch.equal(after.cpu(), expected[1])
