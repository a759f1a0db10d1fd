"""Scenarios under faults: timeouts, killed ranks, teardown, blocking wait, abort, mismatch, hangs, bad input."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from common import RANK, WS, R, close, expect_error, expect_group_error, init, scenario


@scenario
def skip_collective():
    """A rank that skips a collective: the others get DistBackendError naming it within timeout + margin."""
    import time

    timeout = 4.0
    init(timeout=timeout)
    t = torch.ones(16)
    dist.all_reduce(t)  # seq 1 on every rank
    if RANK == WS - 1:
        time.sleep(timeout + 4)  # skip seq 2 and stay alive until the others gave up
    else:
        msg, took = expect_error(lambda: dist.all_reduce(t), dist.DistBackendError, "all_reduce",
                                 "seq 2", str(WS - 1))
        assert took < timeout + 5, f"took {took:.1f}s for a {timeout}s timeout"
    dist.destroy_process_group()


@scenario
def kill_rank():
    """A rank SIGKILLed mid-collective: the others fail fast, long before the 60 s timeout."""
    import signal
    import threading
    import time

    init(timeout=60)
    t = torch.ones(1 << 20)
    for _ in range(3):
        dist.all_reduce(t)
    if RANK == 1:
        threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        while True:
            dist.all_reduce(t)
    t0 = time.monotonic()

    def loop():
        while True:
            dist.all_reduce(t)

    expect_error(loop, dist.DistBackendError, "all_reduce")
    assert time.monotonic() - t0 < 20, "peer death was not detected fast"
    dist.destroy_process_group()


@scenario
def teardown():
    """Default TORCH_HCCL_ASYNC_ERROR_HANDLING: a failed collective tears the process down."""
    import time

    init(timeout=3)
    if RANK == 0:
        try:
            dist.all_reduce(torch.ones(4))
        except dist.DistBackendError:
            time.sleep(30)  # the watchdog must end the process before this returns
        raise AssertionError("the process survived a failed collective")
    time.sleep(10)


@scenario
def blocking_wait():
    """TORCH_HCCL_BLOCKING_WAIT=1: errors reach wait() and the process keeps running."""
    import time

    init(timeout=3)
    if RANK == 0:
        w = dist.all_reduce(torch.ones(4), async_op=True)
        expect_error(w.wait, dist.DistBackendError, "all_reduce", "seq 1")
        assert w.is_completed() and not w.is_success()
        # The same failure reaches a future (what DDP communication hooks consume).
        fut = dist.all_reduce(torch.ones(4), async_op=True).get_future()
        expect_error(fut.wait, dist.DistBackendError, "all_reduce")
        time.sleep(1.0)  # give a (wrong) teardown time to happen
    else:
        time.sleep(10)
    dist.destroy_process_group()


@scenario
def abort_shutdown():
    """abort() fails pending and later ops at once; shutdown makes later ops raise."""
    import time

    init(timeout=30)
    dist.all_reduce(torch.ones(2))
    if RANK == 0:
        w = dist.all_reduce(torch.ones(4), async_op=True)  # rank 1 never joins this one
        time.sleep(0.3)
        t0 = time.monotonic()
        dist.group.WORLD.abort()
        expect_error(w.wait, dist.DistBackendError, "abort")
        assert time.monotonic() - t0 < 5
        expect_error(lambda: dist.all_reduce(torch.ones(4)), (dist.DistBackendError, RuntimeError), "abort")
    else:
        time.sleep(2)
    # A fresh group works after the abort; shutdown then rejects further use of it.
    g = dist.new_group(timeout=timedelta(seconds=20))
    t = torch.ones(3)
    dist.all_reduce(t, group=g)
    close(t, torch.full((3,), float(WS)), "group after abort")
    be = g._get_backend(torch.device("cpu"))
    be.shutdown()
    expect_error(lambda: be.allreduce([torch.ones(1)]), RuntimeError, "shut down")
    dist.destroy_process_group()


@scenario
def mismatch():
    """Mismatched op / size / dtype: the error names the disagreeing ranks and how they differ."""
    init(timeout=20)
    calls = {"op": lambda g: (dist.all_reduce(torch.ones(8), group=g) if RANK == 0
                              else dist.broadcast(torch.ones(8), 0, group=g)),
             "size": lambda g: dist.all_reduce(torch.ones(8 if RANK == 0 else 9), group=g),
             "dtype": lambda g: dist.all_reduce(
                 torch.ones(8, dtype=torch.float32 if RANK == 0 else torch.float64), group=g)}
    for call in calls.values():
        expect_group_error(call, "0", "1")
    dist.destroy_process_group()


@scenario
def staged_hang():
    """Flight recorder: rank WS-1 skips the 4th collective; every rank dumps, for the analyzer."""
    import time

    init(timeout=3)
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    if RANK == WS - 1:
        time.sleep(7)  # skips; its watchdog dumps when the others signal the timeout
    else:
        expect_error(lambda: dist.all_reduce(t), dist.DistBackendError, "all_reduce")
        time.sleep(2.5)  # let the watchdog write the dump
    path = os.environ["TORCH_HCCL_DEBUG_INFO_TEMP_FILE"] + str(RANK)
    assert os.path.exists(path), f"no flight-recorder dump at {path}"
    dist.destroy_process_group()


@scenario
def bad_input():
    """Bad input raises a clear ValueError/RuntimeError on the calling rank; the group stays usable."""
    init(timeout=30)

    def healthy():
        t = torch.ones(2)
        dist.all_reduce(t)
        close(t, torch.full((2,), float(WS)), "all_reduce after bad input")

    expect_error(lambda: dist.all_gather_into_tensor(torch.empty(2 * WS, device="npu"), torch.ones(2)),
                 ValueError, "one device", "npu")
    healthy()
    expect_error(lambda: dist.all_reduce(torch.ones(2), op=R.BAND), ValueError, "BAND", "integer")
    healthy()
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)), ValueError, "elements")
    healthy()
    expect_error(lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * WS + 1)), ValueError,
                 "world_size")
    healthy()
    expect_error(lambda: dist.send(torch.ones(2), dst=WS + 3), (ValueError, RuntimeError), str(WS + 3))
    healthy()
    # send/recv between a rank and itself (as batch_isend_irecv allows): a copy, received in order
    world_be = dist.group.WORLD._get_backend(torch.device("cpu"))
    mine, got = torch.full((3,), float(RANK + 5)), torch.empty(3)
    world_be.send([mine], RANK, 3).wait()
    mine.zero_()  # the send completed: the message is a copy
    world_be.recv([got], RANK, 3).wait()
    close(got, torch.full((3,), float(RANK + 5)), "recv from itself")
    healthy()
    expect_error(lambda: dist.all_reduce(torch.ones(2, dtype=torch.float8_e4m3fn)), ValueError, "dtype")
    healthy()
    g = dist.new_group()
    be = g._get_backend(torch.device("cpu"))
    dist.destroy_process_group(g)
    expect_error(lambda: be.allreduce([torch.ones(2)]), RuntimeError, "destroyed")
    expect_error(lambda: dist.all_reduce(torch.ones(2), group=g), (ValueError, RuntimeError))
    healthy()
    dist.destroy_process_group()


@scenario
def trace_on_demand():
    """dump_flight_recorder(): PyTorch's dump of every group; the ring keeps the last
    TORCH_HCCL_TRACE_BUFFER_SIZE ops of the process."""
    import pickle

    import npudist.hccl as hccl

    init()
    t = torch.ones(4)
    for _ in range(20):
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    doc = pickle.loads(hccl.dump_flight_recorder())
    assert doc["hccl_rank"] == RANK and doc["pg_config"], doc
    entries = doc["entries"]
    assert len(entries) == int(os.environ["TORCH_HCCL_TRACE_BUFFER_SIZE"]), len(entries)
    last = entries[-1]
    assert last["profiling_name"] == "hccl:broadcast" and last["collective_seq_id"] == 21, last
    assert last["state"] == "completed", last
    assert [e["collective_seq_id"] for e in entries] == list(range(22 - len(entries), 22))
    assert doc["pg_status"][str(last["pg_id"])]["last_completed_collective"] == 21
    path = hccl.dump_flight_recorder_to_file()
    with open(path, "rb") as f:
        assert path.endswith(f"trace_{RANK}") and pickle.load(f)["entries"], path
    dist.destroy_process_group()


@scenario
def cleanup_only():
    """TORCH_HCCL_ASYNC_ERROR_HANDLING=2: a failure aborts the communicator (later ops fail at once) and
    the process lives on."""
    import time

    init(timeout=3)
    if RANK == 0:
        expect_error(lambda: dist.all_reduce(torch.ones(4)), dist.DistBackendError, "timed out")
        time.sleep(1.0)  # the watchdog aborts the communicator
        t0 = time.monotonic()
        expect_error(lambda: dist.all_reduce(torch.ones(4)), dist.DistBackendError, "abort")
        assert time.monotonic() - t0 < 1.0, "an op on an aborted communicator did not fail at once"
    else:
        time.sleep(8)
    dist.destroy_process_group()


@scenario
def connect_timeout():
    """HCCL_CONNECT_TIMEOUT bounds group creation when a rank never joins."""
    import time

    init(timeout=30)
    if RANK == 0:
        msg, took = expect_error(lambda: dist.new_group(), dist.DistBackendError, "HCCL_CONNECT_TIMEOUT",
                                 "EI0006", "ranks [1]", "did not join", "after 2 s")
        assert took < 10, f"group creation gave up after {took:.1f}s with HCCL_CONNECT_TIMEOUT=2"
    else:
        time.sleep(6)
