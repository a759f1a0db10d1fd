"""Scenarios: the ops Gloo offers beyond the core collectives on cpu and npu tensors:
all_gather_coalesced (list of lists), recv from any source (+ source rank), sparse COO all_reduce,
monitored barrier (success, a late rank named, wait_all_ranks naming every missing rank), the
barrier timeout message, and torch_npu's uneven all_gather / reduce_scatter and all_to_all_vc."""
from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

import npudist.hccl
from common import RANK, WS, close, expect_error, init, make, reference, scenario


def check_all_gather_coalesced(device: str) -> None:
    shapes = [(2, 3), (0,), (5,), (1, 1, 4)]
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.complex64):
        ins = [make(RANK, max(1, torch.Size(s).numel()), dtype, salt=i)[: torch.Size(s).numel()].reshape(s).to(device)
               for i, s in enumerate(shapes)]
        outs = [[torch.full(s, 7, dtype=dtype).to(device) if dtype != torch.complex64
                 else torch.zeros(s, dtype=dtype).to(device) for s in shapes] for _ in range(WS)]
        dist.all_gather_coalesced(outs, ins)
        for r in range(WS):
            for i, s in enumerate(shapes):
                want = make(r, max(1, torch.Size(s).numel()), dtype, salt=i)[: torch.Size(s).numel()].reshape(s)
                close(outs[r][i], want, f"all_gather_coalesced {dtype} rank {r} input {i} on {device}")
    # Async, and a non-contiguous input.
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t().to(device) + RANK
    outs = [[torch.empty(4, 3, device=device)] for _ in range(WS)]
    dist.all_gather_coalesced(outs, [x], async_op=True).wait()
    for r in range(WS):
        close(outs[r][0], torch.arange(12, dtype=torch.float32).reshape(3, 4).t() + r, "all_gather_coalesced async")
    expect_error(lambda: dist.all_gather_coalesced([[torch.empty(2, device=device)]], [torch.ones(2, device=device)]),
                 ValueError, "one list per rank")
    expect_error(lambda: dist.all_gather_coalesced([[torch.empty(3, device=device)]] * WS,
                                                   [torch.ones(2, device=device)]),
                 ValueError, "output_tensor_lists[0][0] must match input 0")


def check_recv_any_source(device: str) -> None:
    # Every other rank sends rank 0 two messages (tags 5 and 6); rank 0 receives them from any source.
    for tag in (5, 6):
        if RANK == 0:
            seen = {}
            for _ in range(WS - 1):
                t = torch.zeros(3, device=device)
                src = dist.recv(t, tag=tag)
                assert src not in seen, f"source {src} twice"
                seen[src] = t.cpu()
            assert sorted(seen) == list(range(1, WS)), seen
            for src, t in seen.items():
                close(t, torch.full((3,), float(src * 10 + tag)), f"recv any source tag {tag} from {src}")
        else:
            dist.send(torch.full((3,), float(RANK * 10 + tag), device=device), dst=0, tag=tag)
    # irecv without a source: the Work tells the sender.
    if RANK == 1:
        w = dist.irecv(torch.zeros(2, device=device))
        w.wait()
        assert w._source_rank() == 0, w._source_rank()
    elif RANK == 0:
        dist.send(torch.ones(2, device=device), dst=1)
    dist.barrier()


def check_recv_any_source_times_out() -> None:
    g = dist.new_group(timeout=timedelta(seconds=2))
    if RANK == 0:
        msg, took = expect_error(lambda: dist.recv(torch.zeros(1), group=g, tag=3), dist.DistBackendError,
                                 "no rank sent a message with tag 3")
        assert took < 8, took
    dist.barrier()
    dist.destroy_process_group(g)


def check_sparse_all_reduce() -> None:
    g = torch.Generator().manual_seed(11)
    per_rank = []
    for r in range(WS):
        idx = torch.randint(0, 6, (2, 4 + r), generator=g)
        vals = torch.randn(4 + r, 3, generator=g, dtype=torch.float64)  # hybrid: one dense dim
        per_rank.append(torch.sparse_coo_tensor(idx, vals, (6, 6, 3)))
    t = per_rank[RANK].clone()
    dist.all_reduce(t)
    assert t.is_sparse and t.is_coalesced()
    close(t.to_dense(), sum(x.to_dense() for x in per_rank), "sparse all_reduce")
    # A rank without entries, async.
    e = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0), (5,)) if RANK == 0 else \
        torch.sparse_coo_tensor(torch.tensor([[RANK % 5]]), torch.tensor([1.0]), (5,))
    dist.all_reduce(e, async_op=True).wait()
    want = torch.zeros(5)
    for r in range(1, WS):
        want[r % 5] += 1
    close(e.to_dense(), want, "sparse all_reduce with an empty rank")
    expect_error(lambda: dist.all_reduce(per_rank[RANK].clone(), op=dist.ReduceOp.MAX), ValueError,
                 "ReduceOp.SUM only")


def check_monitored_barrier() -> None:
    world = dist.group.WORLD
    npudist.hccl.monitored_barrier(timeout=timedelta(seconds=20))
    world.monitored_barrier(timedelta(seconds=20), wait_all_ranks=True)
    # Rank 1 arrives late but in time.
    if RANK == 1:
        time.sleep(0.5)
    npudist.hccl.monitored_barrier(timeout=timedelta(seconds=20))
    # Odd ranks never arrive: rank 0 names them within the timeout.
    if RANK == 0:
        msg, took = expect_error(lambda: npudist.hccl.monitored_barrier(timeout=timedelta(seconds=2),
                                                                        wait_all_ranks=True),
                                 dist.DistBackendError, "failed to pass monitoredBarrier")
        missing = [r for r in range(1, WS) if r % 2]
        want = ("Rank " if len(missing) == 1 else "Ranks ") + ", ".join(map(str, missing))
        assert want in msg, msg
        assert took < 10, took
    elif RANK % 2 == 0:
        expect_error(lambda: npudist.hccl.monitored_barrier(timeout=timedelta(seconds=2)), dist.DistBackendError,
                     f"Rank {RANK} successfully reached monitoredBarrier")
    dist.barrier()
    expect_error(lambda: npudist.hccl.monitored_barrier(group=world, timeout=-1), ValueError, "timeout")


def check_uneven(device: str) -> None:
    from torch_npu.distributed import all_gather_into_tensor_uneven, reduce_scatter_tensor_uneven

    splits = [r + 1 for r in range(WS)]  # rank r owns r + 1 rows
    rows = [torch.full((r + 1, 2), float(r)) + torch.arange(2.0) for r in range(WS)]
    out = torch.empty(sum(splits), 2, device=device)
    all_gather_into_tensor_uneven(out, rows[RANK].to(device), output_split_sizes=splits)
    close(out, torch.cat(rows), f"all_gather_into_tensor_uneven on {device}")
    out.zero_()
    all_gather_into_tensor_uneven(out, rows[RANK].to(device), output_split_sizes=splits, async_op=True).wait()
    close(out, torch.cat(rows), f"all_gather_into_tensor_uneven async on {device}")
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        ins = [make(r, sum(splits) * 3, dtype, salt=9, small=True).reshape(sum(splits), 3) for r in range(WS)]
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG):
            want = reference([x.reshape(-1) for x in ins], op).reshape(sum(splits), 3)
            want = want[sum(splits[:RANK]): sum(splits[: RANK + 1])]
            for async_op in (False, True):
                o = torch.zeros(splits[RANK], 3, dtype=dtype, device=device)
                w = reduce_scatter_tensor_uneven(o, ins[RANK].to(device), input_split_sizes=splits, op=op,
                                                 async_op=async_op)
                if async_op:
                    w.wait()
                close(o, want, f"reduce_scatter_tensor_uneven {dtype} {op} async={async_op} on {device}")
    expect_error(lambda: all_gather_into_tensor_uneven(out, rows[RANK].to(device), output_split_sizes=[1] * (WS + 1)),
                 ValueError, "Number of tensor splits not equal to group size")
    expect_error(lambda: reduce_scatter_tensor_uneven(torch.zeros(1, 3, device=device),
                                                      torch.zeros(WS + 1, 3, device=device),
                                                      input_split_sizes=[1] * WS),
                 ValueError, "Split sizes doesn't match total dim 0 size")
    check_all_to_all_vc(device)


def check_all_to_all_vc(device: str) -> None:
    from torch_npu.distributed import all_to_all_vc

    # rank i sends (i + j) % 3 + 1 elements to rank j; the parts carry (sender, receiver, index).
    matrix = [[(i + j) % 3 + 1 for j in range(WS)] for i in range(WS)]

    def part(i, j):
        return torch.tensor([100.0 * i + 10 * j + k for k in range(matrix[i][j])])

    send = torch.cat([part(RANK, j) for j in range(WS)]).to(device)
    want = torch.cat([part(i, RANK) for i in range(WS)])
    for async_op in (False, True):
        out = torch.zeros(sum(matrix[i][RANK] for i in range(WS)), device=device)
        w = all_to_all_vc(out, send, matrix, async_op=async_op)
        if async_op:
            w.wait()
        close(out, want, f"all_to_all_vc async={async_op} on {device}")
    expect_error(lambda: all_to_all_vc(out, send, [[1] * WS]), ValueError, "square")
    expect_error(lambda: all_to_all_vc(out[1:], send, matrix), ValueError, "output has")


def check_barrier_timeout_message() -> None:
    g = dist.new_group(timeout=timedelta(seconds=1))
    if RANK == 0:
        t0 = time.monotonic()
        msg, _ = expect_error(lambda: dist.barrier(g), dist.DistBackendError, " timeout ", "did not arrive")
        assert time.monotonic() - t0 < 8, msg
    dist.barrier()


def check_barrier_with_timeout_argument() -> None:
    # Every rank arrives, one late but within the call's timeout (shorter than the group's 60 s).
    if RANK == 1:
        time.sleep(0.3)
    dist.barrier(timeout=timedelta(seconds=10))
    dist.barrier(async_op=True, timeout=timedelta(seconds=10)).wait()
    # Odd ranks never arrive: the others raise after the call's 1 s, naming them.
    g = dist.new_group()
    if RANK % 2 == 0:
        missing = ", ".join(str(r) for r in range(WS) if r % 2)
        msg, took = expect_error(lambda: dist.barrier(g, timeout=timedelta(seconds=1)), dist.DistBackendError,
                                 "timeout of 1000 ms", f"ranks [{missing}] did not arrive")
        assert took < 6, took
    dist.barrier()


@scenario
def extras():
    init()
    for device in ("cpu", "npu"):
        if device == "npu":
            torch.npu.set_device(RANK % torch.npu.device_count())
        check_all_gather_coalesced(device)
        check_recv_any_source(device)
        check_uneven(device)
    check_recv_any_source_times_out()
    check_sparse_all_reduce()
    check_monitored_barrier()
    check_barrier_timeout_message()
    check_barrier_with_timeout_argument()
    dist.destroy_process_group()
