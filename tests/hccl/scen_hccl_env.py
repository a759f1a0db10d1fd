"""Scenarios for HCCL's environment with CANN's meaning: communicator buffers charged to device memory
(HCCL_BUFFSIZE, hccl_config), EI0002 / EI0006 timeouts, HCCL_DETERMINISTIC, the heartbeat monitor."""
from __future__ import annotations

import hashlib
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from common import RANK, WS, expect_error, init, scenario

MiB = 1 << 20


def _backend(group):
    return group._get_backend(torch.device("npu"))


def _held(device: int) -> int:
    return torch.npu.memory_stats(device)["hccl_buffer_bytes.current"]


@scenario
def comm_buffers():
    """HCCL_BUFFSIZE=200: every group that moves npu tensors holds 2 x 200 MB on its device (mem_get_info,
    memory_stats, the caching allocator's room and its OOM message), per-group hccl_config overrides it, a
    communicator that does not fit is an OutOfMemoryError, destroying a group gives its buffers back."""
    dev = RANK
    torch.npu.set_device(dev)
    init(timeout=60)
    assert int(os.environ["HCCL_BUFFSIZE"]) == 200
    t = torch.ones(1024, device="npu")
    dist.barrier()
    free0, total = torch.npu.mem_get_info(dev)
    allocated0 = torch.npu.memory_allocated(dev)
    assert _held(dev) == 0, _held(dev)   # the world group has moved no npu tensor yet

    groups = [dist.new_group() for _ in range(8)]
    assert _held(dev) == 0                                   # a group charges when it first moves npu tensors
    for k, g in enumerate(groups, 1):
        dist.all_reduce(t, group=g)
        assert _held(dev) == k * 400 * MiB, (k, _held(dev))
    be = _backend(groups[0])
    assert (be.buffer_bytes, be.device_buffer_bytes, be.staging_bytes) == (200 * MiB, 400 * MiB, 8 * MiB)
    assert be.charged_devices == [dev]
    free8, _ = torch.npu.mem_get_info(dev)
    assert free0 - free8 == 8 * 400 * MiB, (free0, free8)
    print(f"rank {RANK}: 8 groups hold hccl_buffer_bytes.current={_held(dev)}; mem_get_info free fell by "
          f"{free0 - free8}", flush=True)
    assert torch.npu.memory_allocated(dev) == allocated0     # tensors only: HCCL's buffers are not PyTorch's
    assert t[0].item() == WS ** 8

    # hccl_config overrides HCCL_BUFFSIZE for one group.
    import npudist.hccl as hccl

    opts = hccl.ProcessGroupHCCL.Options()
    opts.hccl_config = {"hccl_buffer_size": 16}
    small = dist.new_group(pg_options=opts)
    dist.all_reduce(t, group=small)
    assert _held(dev) == 8 * 400 * MiB + 32 * MiB
    assert _backend(small).device_buffer_bytes == 32 * MiB

    # The caching allocator has only what the buffers leave: 14 GiB fits a 16 GiB device, not beside 3.16 GiB.
    big = 14 << 30
    assert big < total - torch.npu.memory_reserved(dev)
    msg, _ = expect_error(lambda: torch.empty(big, dtype=torch.uint8, device="npu"), torch.OutOfMemoryError,
                          "NPU out of memory", "Including non-PyTorch memory",
                          "8 x hccl communicator (2 x HCCL_BUFFSIZE=200 MB): 3.12 GiB",
                          "1 x hccl communicator (2 x hccl_config['hccl_buffer_size']=16 MB): 32.00 MiB")

    # A communicator whose buffers do not fit: the op fails with the device's numbers before anything is issued.
    opts.hccl_config = {"hccl_buffer_size": 8000}
    huge = dist.new_group(pg_options=opts)
    expect_error(lambda: dist.all_reduce(t, group=huge), torch.OutOfMemoryError,
                 "the hccl communicator of group", f"on npu:{dev}", "2 x hccl_config['hccl_buffer_size']=8000 MB",
                 "is free", "3.16 GiB in communication buffers",
                 "8 x hccl communicator (2 x HCCL_BUFFSIZE=200 MB): 3.12 GiB")
    dist.destroy_process_group(huge)
    assert _held(dev) == 8 * 400 * MiB + 32 * MiB

    # Destroying a group releases its buffers; a group bound to a device charges it at creation, as NCCL
    # creates the communicator eagerly.
    dist.destroy_process_group(small)
    for g in groups[:4]:
        dist.destroy_process_group(g)
    assert _held(dev) == 4 * 400 * MiB, _held(dev)
    eager = dist.new_group(device_id=torch.device("npu", dev))
    assert _backend(eager).charged_devices == [dev] and _held(dev) == 5 * 400 * MiB, _held(dev)
    dist.all_reduce(t, group=eager)
    assert _held(dev) == 5 * 400 * MiB
    dist.destroy_process_group()
    assert _held(dev) == 0, _held(dev)


@scenario
def exec_timeouts():
    """A collective a peer never joins fails with EI0002 within the configured time: hccl_config's
    hccl_exec_timeout (shorter than the group's timeout) for one group, HCCL_EXEC_TIMEOUT for the world.
    HCCL_ASYNC_ERROR_HANDLING=2 (the older name) then aborts the communicator without ending the process."""
    import npudist.hccl as hccl

    init(timeout=1800)   # the default timeout: HCCL_EXEC_TIMEOUT applies to the world group
    assert dist.group.WORLD._get_backend(torch.device("cpu")).timeout == timedelta(seconds=3)
    opts = hccl.ProcessGroupHCCL.Options()
    opts.hccl_config = {"hccl_exec_timeout": 2}
    g = dist.new_group(timeout=timedelta(seconds=30), pg_options=opts)
    t = torch.ones(4)
    dist.all_reduce(t, group=g)
    if RANK == 1:
        time.sleep(12)    # skips one collective of g and one of the world; alive until rank 0 is done
    else:
        msg, took = expect_error(lambda: dist.all_reduce(t, group=g), dist.DistBackendError, "EI0002",
                                 "timed out", "hccl_config['hccl_exec_timeout']", "remote rank [1]", "all_reduce")
        assert 1.5 < took < 5, took
        msg, took = expect_error(lambda: dist.all_reduce(t), dist.DistBackendError, "EI0002",
                                 "after 3 s (HCCL_EXEC_TIMEOUT)", "remote rank [1]", "all_reduce (seq 1)")
        assert 2.5 < took < 6, took
        time.sleep(1.0)   # the watchdog aborts the communicator (mode 2), and keeps the process
        t0 = time.monotonic()
        expect_error(lambda: dist.all_reduce(t), dist.DistBackendError, "abort")
        assert time.monotonic() - t0 < 1.0
    dist.destroy_process_group()


def _order_sensitive(rank: int, n: int) -> torch.Tensor:
    """float32 values of mixed magnitude: their sum rounds differently in different orders."""
    g = torch.Generator().manual_seed(77 + rank)
    scale = torch.pow(10.0, torch.randint(-3, 8, (n,), generator=g).double())
    x = torch.randn(n, generator=g, dtype=torch.float64) * scale
    return x.float()


def _fold(n: int) -> torch.Tensor:
    """The engine's order: rank 0 + rank 1, + rank 2, ... in fp32."""
    acc = _order_sensitive(0, n)
    for r in range(1, WS):
        acc = acc + _order_sensitive(r, n)
    return acc


@scenario
def deterministic_sum():
    """HCCL_DETERMINISTIC: a float32 sum is the rank-order fold bit for bit, on every rank and in every run,
    whatever the algorithm (one-shot, pipelined, zero-copy on npu tensors) or op (all_reduce, reduce_scatter,
    reduce). Prints a digest of the results for the comparison across runs."""
    init(timeout=60)
    level = os.environ["HCCL_DETERMINISTIC"]
    assert dist.group.WORLD._get_backend(torch.device("cpu")).deterministic == level.lower()
    digest = hashlib.sha256()
    for n, device in ((1000, "cpu"), (1 << 20, "cpu"), (1 << 20, "npu")):
        want = _fold(n)
        reverse = _order_sensitive(WS - 1, n)
        for r in range(WS - 2, -1, -1):
            reverse = reverse + _order_sensitive(r, n)
        assert not torch.equal(want, reverse), "the inputs must make the order visible"
        for _ in range(2):
            x = _order_sensitive(RANK, n).to(device)
            dist.all_reduce(x)
            assert torch.equal(x.cpu(), want), f"all_reduce n={n} {device}"
            digest.update(x.cpu().numpy().tobytes())
        per = n // WS
        out = torch.empty(per, device=device)
        dist.reduce_scatter_tensor(out, _order_sensitive(RANK, per * WS).to(device))
        assert torch.equal(out.cpu(), _fold(per * WS)[RANK * per:(RANK + 1) * per]), f"reduce_scatter n={n}"
        x = _order_sensitive(RANK, n).to(device)
        dist.reduce(x, dst=0)
        if RANK == 0:
            assert torch.equal(x.cpu(), want), f"reduce n={n} {device}"
    digests = [None] * WS
    dist.all_gather_object(digests, digest.hexdigest())
    assert len(set(digests)) == 1, digests
    print("DIGEST", digests[0], flush=True)
    dist.destroy_process_group()


@scenario
def stuck_watchdog():
    """TORCH_HCCL_ENABLE_MONITORING=1: a watchdog that stops beating (blocked on the group's store, which a
    helper process locks) ends the process after TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC."""
    init(timeout=60)
    dist.all_reduce(torch.ones(2))
    dist.barrier()
    if RANK == 0:
        # The FileStore takes an flock for every operation: hold it, and every watchdog polling the store
        # (TORCH_HCCL_DUMP_ON_TIMEOUT=1 makes them poll each second) blocks. A separate process holds it, so
        # the first rank to be ended does not release it before the other rank's monitor has fired; it lets
        # go by itself after 15 s.
        import subprocess
        import sys

        holder = subprocess.Popen(
            [sys.executable, "-c", "import fcntl, os, sys, time\n"
             "fd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\n"
             "time.sleep(15)", os.environ["HCCL_TEST_STORE"]], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "locked"
    time.sleep(30)
    raise AssertionError("the heartbeat monitor did not end the process")
