"""Scenarios of tests/hccl/test_reinit.py: torch_npu.distributed.reinit_process_group on hccl groups (2 ranks).

Run by launcher.run_ranks(..., worker=this file). Every rank checks results against the value it computes
itself; ranks are put in order through the default group's store (keys under "reinit_test/").
"""
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from common import RANK, SCENARIOS, WS, close, expect_error, init, scenario
from torch_npu.distributed import reinit_process_group


def _store():
    return dist.distributed_c10d._get_default_store()


def _signal(key: str) -> None:
    _store().set("reinit_test/" + key, "1")


def _await(key: str, seconds: float = 30.0) -> None:
    _store().wait(["reinit_test/" + key], timedelta(seconds=seconds))


def _hccl(group=None):
    g = group if group is not None else dist.group.WORLD
    return g._get_backend(torch.device("npu"))


def _all_reduce_checked(device: str, what: str, group=None, salt: float = 0.0) -> None:
    """all_reduce of (rank + 1 + salt) * [1, 2, 3, 4] on `device`: every rank knows the sum."""
    base = torch.arange(1.0, 5.0)
    t = (base * (RANK + 1 + salt)).to(device)
    dist.all_reduce(t, group=group)
    close(t, base * sum(r + 1 + salt for r in range(WS)), what)


@scenario
def reinit_then_collectives(device):
    """all_reduce, reinit (group=None: the default group), all_reduce equals the expected sum again; twice."""
    init(timeout=20)
    be = _hccl()
    name = be.comm_name
    _all_reduce_checked(device, "before reinit")
    for generation in (1, 2):
        assert reinit_process_group() is dist.group.WORLD
        assert be.comm_generation == generation, be.comm_generation
        _all_reduce_checked(device, f"first op after reinit {generation}", salt=generation)
        # Asynchronous ops and another collective on the rebuilt communicator.
        x = torch.full((8,), float(RANK), device=device)
        dist.broadcast(x, src=1, async_op=True).wait()
        close(x, torch.full((8,), 1.0, device=device), "broadcast after reinit")
        out = torch.empty(WS * 3, device=device)
        dist.all_gather_into_tensor(out, torch.full((3,), float(RANK), device=device))
        close(out, torch.arange(WS).repeat_interleave(3).float().to(device), "all_gather after reinit")
    # The group keeps its communicator name (torch_npu's get_hccl_comm_name stays valid).
    assert be.comm_name == name, (be.comm_name, name)
    dist.barrier()
    dist.destroy_process_group()


@scenario
def reinit_after_hung_collective(device):
    """Rank 1 skips a collective; rank 0's is hung until rank 0 reinits, which fails it; after both reinit, a
    collective works. Run with TORCH_HCCL_ASYNC_ERROR_HANDLING=1: a failure of the discarded communicator must
    not tear the process down."""
    init(timeout=20)
    _all_reduce_checked(device, "before the fault")
    if RANK == 0:
        work = dist.all_reduce(torch.ones(4, device=device), async_op=True)  # rank 1 never joins
        time.sleep(0.5)
        assert not work.is_completed()
        t0 = time.monotonic()
        reinit_process_group()
        assert time.monotonic() - t0 < 10, "reinit waited for the hung collective"
        # The hung op failed when reinit aborted its communicator.
        assert work.is_completed()

        def wait():
            # npu tensors under asynchronous launch: wait() hands the failure to the stream, which raises it at
            # the next synchronization (docs/hccl.md, "Work.wait() on npu tensors").
            work.wait()
            if device == "npu":
                torch.npu.synchronize()

        expect_error(wait, RuntimeError, "abort_hccl_comm(reinit)")
        _signal("rank0_reinit")
    else:
        _await("rank0_reinit")
        reinit_process_group()
    _all_reduce_checked(device, "after both reinit")
    time.sleep(1.0)  # the watchdog (200 ms loop) saw the failed op of the old communicator by now
    _all_reduce_checked(device, "after the watchdog's turn", salt=1)
    dist.destroy_process_group()


@scenario
def reinit_after_timeout():
    """Rank 0's collective times out (EI0002) and the watchdog aborts the group (error handling 2: abort, keep
    the process); ops then fail pointing at reinit_process_group; after both reinit, collectives work."""
    timeout = 3.0
    init(timeout=timeout)
    _all_reduce_checked("cpu", "before the fault")
    if RANK == 0:
        expect_error(lambda: dist.all_reduce(torch.ones(4)), dist.DistBackendError, "EI0002", "[1]")
        time.sleep(2.0)  # the watchdog (a 200 ms loop) aborts the communicator
        expect_error(lambda: dist.all_reduce(torch.ones(4)), dist.DistBackendError, "aborted", "reinit_process_group")
        _signal("rank0_checked")
    else:
        _await("rank0_checked")  # skip the collective; a reinit before rank 0 gave up would fail its op instead
    reinit_process_group()
    _all_reduce_checked("cpu", "after both reinit")
    dist.destroy_process_group()


@scenario
def reinit_on_one_rank_only():
    """Rank 0 reinits, rank 1 does not: rank 1's collective fails at once (its communicator was aborted by rank
    0), rank 0's fails within the group's timeout naming rank 1; once rank 1 reinits too, both meet."""
    timeout = 4.0
    init(timeout=timeout)
    _all_reduce_checked("cpu", "before reinit")
    if RANK == 0:
        reinit_process_group()
        _signal("rank0_reinit")
        msg, took = expect_error(lambda: dist.all_reduce(torch.ones(4)), dist.DistBackendError, "all_reduce",
                                 "reinit_process_group", "ranks [1]", "did not arrive")
        assert took < timeout + 5, f"took {took:.1f}s for a {timeout}s timeout"
        _signal("rank0_gave_up")
    else:
        _await("rank0_reinit")
        msg, took = expect_error(lambda: dist.all_reduce(torch.ones(4)), dist.DistBackendError,
                                 "abort_hccl_comm(reinit) on rank 0", "reinit_process_group")
        assert took < timeout, f"took {took:.1f}s"
        _await("rank0_gave_up")
        reinit_process_group()
    # Rank 0 tries the rebuild again at its next op, under the same generation as rank 1's.
    _all_reduce_checked("cpu", "after rank 1 reinit too")
    assert _hccl().comm_generation == 1
    dist.destroy_process_group()


@scenario
def reinit_other_paths():
    """rebuild_link=False, gloo and mixed groups, group=None against a subgroup, bad arguments."""
    expect_error(lambda: reinit_process_group(), RuntimeError, "init_process_group")
    init(timeout=20)
    be = _hccl()
    name = be.comm_name
    # rebuild_link=False: nothing was suspended (stop_device is refused), so nothing changes; returns None.
    assert reinit_process_group(rebuild_link=False) is None
    assert be.comm_generation == 0 and be.comm_name == name
    _all_reduce_checked("cpu", "after rebuild_link=False")

    # group=None rebuilds the default group only.
    sub = dist.new_group(timeout=timedelta(seconds=20))
    _all_reduce_checked("cpu", "subgroup before", group=sub)
    assert reinit_process_group(None) is dist.group.WORLD
    assert be.comm_generation == 1 and _hccl(sub).comm_generation == 0
    _all_reduce_checked("cpu", "subgroup untouched", group=sub)
    _all_reduce_checked("cpu", "default group rebuilt")
    assert reinit_process_group(sub) is sub and _hccl(sub).comm_generation == 1
    _all_reduce_checked("npu", "subgroup rebuilt", group=sub)

    # A gloo group: torch_npu acts on hccl only; the group comes back unchanged and keeps working.
    gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=20))
    assert reinit_process_group(gloo) is gloo
    _all_reduce_checked("cpu", "gloo group", group=gloo)

    # cpu over gloo, npu over hccl: the hccl side is rebuilt, the gloo side stays.
    mixed = dist.new_group(backend="cpu:gloo,npu:hccl", timeout=timedelta(seconds=20))
    _all_reduce_checked("npu", "mixed group, npu", group=mixed)
    assert reinit_process_group(mixed) is mixed
    assert _hccl(mixed).comm_generation == 1
    _all_reduce_checked("npu", "mixed group rebuilt, npu", group=mixed, salt=2)
    _all_reduce_checked("cpu", "mixed group, cpu over gloo", group=mixed)

    # Calling it again before the rebuild changes nothing: the ranks meet under the first call's generation.
    reinit_process_group()
    if RANK == 0:
        reinit_process_group()
    _all_reduce_checked("cpu", "after repeated reinit")
    assert be.comm_generation == 2, be.comm_generation

    expect_error(lambda: reinit_process_group(object()), ValueError, "not a process group")
    dist.destroy_process_group(sub)
    expect_error(lambda: reinit_process_group(sub), ValueError, "not a process group")
    dist.destroy_process_group()


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
    print("SCENARIO OK", flush=True)
