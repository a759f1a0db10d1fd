"""Scenarios: the newer c10d Backend capabilities on hccl (coalescing, shrink, tensors allocated by the group for
communication), each used through PyTorch's own API and checked against values every rank can compute."""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from torch.distributed.distributed_c10d import SHRINK_ABORT

from common import RANK, WS, init, scenario


def _device() -> str:
    return sys.argv[2] if len(sys.argv) > 2 else "npu"


def _expect_error(call, error: type, text: str) -> None:
    try:
        call()
    except error as e:
        assert text in str(e), e
        return
    raise AssertionError(f"expected {error.__name__} with {text!r}")


@scenario
def coalescing():
    """_coalescing_manager(group, device): the ops issued inside complete as one Work; batch_isend_irecv takes
    the coalescing path (supports_coalescing); an unbalanced start/end is an error naming itself."""
    dev = _device()
    init(device_id=torch.device("npu", RANK) if dev == "npu" else None)
    if dev == "npu":
        torch.npu.set_device(RANK)
    device = torch.device(dev, RANK) if dev == "npu" else torch.device("cpu")
    be = dist.group.WORLD._get_backend(device)
    assert be.supports_coalescing and be.supports_splitting
    # torch records same-type all_reduces and issues one allreduce_coalesced; other ops reach the group as they
    # are issued. Either way the manager's one Work is endCoalescing's.
    a = torch.full((5,), float(RANK + 1), device=device)
    a2 = torch.arange(3, dtype=torch.float32, device=device) * (RANK + 1)
    with dist._coalescing_manager(device=device, async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(a2)
    assert len(cm.works) == 1, cm.works
    cm.wait()
    total = float(sum(range(1, WS + 1)))
    assert torch.equal(a.cpu(), torch.full((5,), total))
    assert torch.equal(a2.cpu(), torch.arange(3, dtype=torch.float32) * total)
    c = torch.full((4,), float(RANK), device=device)
    d = torch.arange(6, dtype=torch.float64, device=device) + RANK
    with dist._coalescing_manager(device=device, async_ops=True) as cm:
        dist.broadcast(c, src=WS - 1)
        dist.broadcast(d, src=0)
    fut = cm.works[0].get_future()
    cm.wait()
    values = fut.wait()
    assert torch.equal(c.cpu(), torch.full((4,), float(WS - 1)))
    assert torch.equal(d.cpu(), torch.arange(6, dtype=torch.float64))
    assert [v.data_ptr() for v in values] == [c.data_ptr(), d.data_ptr()], values

    # p2p: a ring exchange in one batch, both directions
    right, left = (RANK + 1) % WS, (RANK - 1) % WS
    send_r = torch.full((6,), float(RANK), device=device)
    send_l = torch.full((6,), float(100 + RANK), device=device)
    from_l, from_r = torch.empty(6, device=device), torch.empty(6, device=device)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send_r, right), dist.P2POp(dist.irecv, from_l, left),
                                   dist.P2POp(dist.isend, send_l, left), dist.P2POp(dist.irecv, from_r, right)])
    for r in reqs:
        r.wait()
    assert torch.equal(from_l.cpu(), torch.full((6,), float(left)))
    assert torch.equal(from_r.cpu(), torch.full((6,), float(100 + right)))

    # nothing issued: no Work (as ProcessGroupNCCL), and the group is usable after
    pg = dist.group.WORLD
    pg._start_coalescing(device)
    assert pg._end_coalescing(device) is None
    _expect_error(lambda: pg._end_coalescing(device), RuntimeError, "endCoalescing() without startCoalescing()")
    pg._start_coalescing(device)
    _expect_error(lambda: pg._start_coalescing(device), RuntimeError, "coalescing group is open")
    pg._end_coalescing(device)
    t = torch.ones(2, device=device)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.full((2,), float(WS)))
    dist.destroy_process_group()


@scenario
def shrink():
    """torch.distributed.shrink_group on 4 ranks: rank 1 leaves. First a subgroup whose pending all_reduce rank 1
    never joins is shrunk with SHRINK_ABORT (the pending op fails, the new group works); then the default group
    is shrunk and becomes the new default group of ranks 0, 2, 3."""
    dev = _device()
    init(device_id=torch.device("npu", RANK) if dev == "npu" else None, timeout=30.0)
    if dev == "npu":
        torch.npu.set_device(RANK)
    device = torch.device(dev, RANK) if dev == "npu" else torch.device("cpu")
    assert dist.group.WORLD._get_backend(device).supports_shrinking
    sub = dist.new_group(list(range(WS)))
    dist.barrier()
    if RANK == 1:
        dist.barrier(group=sub)   # the last op rank 1 takes part in; then it is gone
        dist.destroy_process_group()
        return
    dist.barrier(group=sub)
    stuck = torch.ones(3, device=device)
    pending = dist.all_reduce(stuck, group=sub, async_op=True)   # rank 1 never joins
    small = dist.shrink_group([1], group=sub, shrink_flags=SHRINK_ABORT)

    def wait_pending():
        pending.wait()   # on npu: orders the stream after the op (NCCL's semantics); the error arrives at its sync
        if dev == "npu":
            torch.npu.synchronize()

    _expect_error(wait_pending, RuntimeError, "was aborted")
    remaining = [0, 2, 3]
    assert dist.get_world_size(small) == 3 and dist.get_rank(small) == remaining.index(RANK)
    t = torch.full((4,), float(RANK), device=device)
    dist.all_reduce(t, group=small)
    assert torch.equal(t.cpu(), torch.full((4,), float(sum(remaining))))

    world = dist.shrink_group([1])
    assert dist.get_world_size() == 3 and dist.get_rank() == remaining.index(RANK)
    assert world is dist.group.WORLD or dist.get_world_size(world) == 3
    u = torch.full((2,), float(RANK + 1), device=device)
    dist.all_reduce(u)
    assert torch.equal(u.cpu(), torch.full((2,), float(sum(r + 1 for r in remaining))))
    _expect_error(lambda: dist.shrink_group([5]), ValueError, "")
    dist.destroy_process_group()


@scenario
def alloc_for_comm():
    """FSDP2's set_allocate_memory_from_process_group_for_comm: hccl allocates npu staging buffers; training
    equals the same model without it, bitwise. cpu devices are not served (torch falls back to torch.empty)."""
    from torch.distributed.fsdp import fully_shard

    init(device_id=torch.device("npu", RANK))
    torch.npu.set_device(RANK)
    dev = torch.device("npu", RANK)
    be = dist.group.WORLD._get_backend(dev)
    assert be.supports_tensor_alloc(dev) and not be.supports_tensor_alloc(torch.device("cpu"))
    buf = be.allocate_tensor(12, dtype=torch.bfloat16, device=dev)
    assert buf.shape == (12,) and buf.dtype == torch.bfloat16 and buf.device == dev
    _expect_error(lambda: be.allocate_tensor(4, dtype=torch.float32, device=torch.device("cpu")), ValueError,
                  "npu tensors")

    def train(from_pg: bool) -> list[float]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to(dev)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        model.set_allocate_memory_from_process_group_for_comm(from_pg)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(RANK)
        losses = []
        for _ in range(3):
            x = torch.randn(4, 16, generator=g).to(dev)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    plain, from_pg = train(False), train(True)
    assert plain == from_pg, (plain, from_pg)
    dist.destroy_process_group()
