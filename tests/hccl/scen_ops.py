"""Scenarios: every collective x dtype x reduce op, p2p, coalesced, objects, functional, async."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from common import ALL_DTYPES, RANK, WS, R, close, expect_error, init, make, ops_for, reference, scenario


# ------------------------------------------------------------------------------------------------
# Scenarios

def check_all_reduce_matrix(device: str, sizes, group=None, ranks=None) -> int:
    ranks = ranks or list(range(WS))
    me = ranks.index(RANK)
    checks = 0
    for dtype in ALL_DTYPES:
        for op in ops_for(dtype):
            for n in sizes:
                small = op == R.PRODUCT
                xs = [make(r, n, dtype, salt=3, small=small) for r in ranks]
                t = xs[me].clone().to(device)
                if op == "PREMUL":
                    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=group)
                    want = reference(xs, R.SUM, scale=0.5)
                else:
                    dist.all_reduce(t, op=op, group=group)
                    want = reference(xs, op)
                close(t, want, f"all_reduce {dtype} {op} n={n} on {device}")
                checks += 1
    return checks


def check_other_collectives(device: str, n: int, group=None, ranks=None) -> int:
    ranks = ranks or list(range(WS))
    ws = len(ranks)
    me = ranks.index(RANK)
    checks = 0
    for dtype in [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.complex64]:
        xs = [make(r, n, dtype, salt=5) for r in ranks]
        mine = xs[me].to(device)
        # broadcast from the last rank
        t = mine.clone()
        dist.broadcast(t, src=ranks[-1], group=group)
        close(t, xs[-1], f"broadcast {dtype}")
        # reduce to rank 1 (others unchanged)
        if dtype != torch.complex64:
            t = mine.clone()
            dist.reduce(t, dst=ranks[1 % ws], op=R.MAX, group=group)
            close(t, reference(xs, R.MAX) if me == 1 % ws else xs[me], f"reduce {dtype}")
        # all_gather (list) and into tensor
        outs = [torch.empty(n, dtype=dtype, device=device) for _ in range(ws)]
        dist.all_gather(outs, mine, group=group)
        for r in range(ws):
            close(outs[r], xs[r], f"all_gather {dtype} from {r}")
        flat = torch.empty(n * ws, dtype=dtype, device=device)
        dist.all_gather_into_tensor(flat, mine, group=group)
        close(flat, torch.cat(xs), f"all_gather_into_tensor {dtype}")
        # reduce_scatter (list) and tensor
        if dtype not in (torch.complex64,):
            op = R.SUM if dtype != torch.bool else R.MAX
            big = [make(r, n * ws, dtype, salt=9) for r in ranks]
            red = reference(big, op)
            out = torch.empty(n, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(out, big[me].to(device), op=op, group=group)
            close(out, red[me * n:(me + 1) * n], f"reduce_scatter_tensor {dtype}")
            out2 = torch.empty(n, dtype=dtype, device=device)
            dist.reduce_scatter(out2, list(big[me].to(device).chunk(ws)) if n else
                                [torch.empty(0, dtype=dtype, device=device)] * ws, op=op, group=group)
            close(out2, red[me * n:(me + 1) * n], f"reduce_scatter {dtype}")
        # gather / scatter to/from rank 0 of the group
        root = ranks[0]
        gl = [torch.empty(n, dtype=dtype, device=device) for _ in range(ws)] if me == 0 else None
        dist.gather(mine, gather_list=gl, dst=root, group=group)
        if me == 0:
            for r in range(ws):
                close(gl[r], xs[r], f"gather {dtype} from {r}")
        sl = [x.to(device) for x in xs] if me == 0 else None
        out = torch.empty(n, dtype=dtype, device=device)
        dist.scatter(out, scatter_list=sl, src=root, group=group)
        close(out, xs[me], f"scatter {dtype}")
        checks += 9
    # all_to_all_single with uneven splits: rank i sends (i + j) % 3 + j rows to rank j
    def split(i, j):
        return (i + j) % 3 + j

    for dtype in [torch.float32, torch.int32, torch.bfloat16]:
        rows = [[make(i, 2 * split(i, j), dtype, salt=11 + j).view(-1, 2) for j in range(ws)] for i in range(ws)]
        inp = torch.cat(rows[me]).to(device)
        out = torch.empty(sum(split(i, me) for i in range(ws)), 2, dtype=dtype, device=device)
        dist.all_to_all_single(out, inp, output_split_sizes=[split(i, me) for i in range(ws)],
                               input_split_sizes=[split(me, j) for j in range(ws)], group=group)
        close(out, torch.cat([rows[i][me] for i in range(ws)]), f"all_to_all_single uneven {dtype}")
        # list form
        outs = [torch.empty(split(i, me), 2, dtype=dtype, device=device) for i in range(ws)]
        dist.all_to_all(outs, [r.to(device) for r in rows[me]], group=group)
        for i in range(ws):
            close(outs[i], rows[i][me], f"all_to_all {dtype} from {i}")
        # all_gather / reduce_scatter (list forms) with a different size per rank, as NCCL allows:
        # rank r contributes (and receives) split(r, r) rows
        outs = [torch.empty(split(i, i), 2, dtype=dtype, device=device) for i in range(ws)]
        dist.all_gather(outs, rows[me][me].to(device), group=group)
        for i in range(ws):
            close(outs[i], rows[i][i], f"uneven all_gather {dtype} from {i}")
        ins = [make(me, 2 * split(j, j), dtype, salt=17 + j).view(-1, 2).to(device) for j in range(ws)]
        out = torch.empty(split(me, me), 2, dtype=dtype, device=device)
        dist.reduce_scatter(out, ins, op=R.SUM, group=group)
        want = reference([make(i, 2 * split(me, me), dtype, salt=17 + me) for i in range(ws)], R.SUM)
        close(out, want.view(-1, 2), f"uneven reduce_scatter {dtype}")
        checks += 4
    return checks


@scenario
def collectives():
    """Every op x dtype x reduce op on cpu (and npu when asked), sizes 0, 1, odd and > shm buffer."""
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    init()
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert be.buffer_bytes == int(os.environ["HCCL_BUFFSIZE"]) << 20, be.buffer_bytes
    big = (int(os.environ["HCCL_BUFFSIZE"]) << 20) // 4 + 12345  # > buffer in float32 elements
    checks = check_all_reduce_matrix(device, [0, 1, 7])
    # Chunked paths (larger than the shm buffer) for a few dtypes.
    for dtype in [torch.float32, torch.bfloat16, torch.int64]:
        xs = [make(r, big, dtype, salt=1) for r in range(WS)]
        t = xs[RANK].clone().to(device)
        dist.all_reduce(t)
        close(t, reference(xs, R.SUM), f"all_reduce big {dtype}")
        checks += 1
    for n in [0, 1, 7, big // WS]:
        checks += check_other_collectives(device, n)
    print(f"rank {RANK}: {checks} checks", flush=True)
    dist.barrier()
    dist.destroy_process_group()


@scenario
def p2p_and_misc():
    """send/recv with tags, isend/irecv, batch_isend_irecv (both sides send first), barrier, coalesced
    variants, object collectives, non-contiguous tensors, functional collectives, async overlap."""
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    init()
    peer = RANK ^ 1
    # send/recv with tags (in order), sizes incl. larger than the p2p buffer
    for n, tag in [(1, 0), (7, 3), (300_000, 5)]:
        if RANK % 2 == 0:
            dist.send(make(RANK, n, torch.float32).to(device), dst=peer, tag=tag)
            t = torch.empty(n, device=device)
            dist.recv(t, src=peer, tag=tag)
        else:
            t = torch.empty(n, device=device)
            dist.recv(t, src=peer, tag=tag)
            dist.send(make(RANK, n, torch.float32).to(device), dst=peer, tag=tag)
        close(t, make(peer, n, torch.float32), f"send/recv n={n}")
    # As ProcessGroupNCCL since torch 2.8: a synchronous collective (asyncOp=False, what dist.all_reduce()
    # passes) has completed when the backend returns and returns no Work; an asynchronous one returns its Work;
    # bad input to a synchronous one raises from the call itself.
    pg = dist.group.WORLD
    t = torch.full((3,), float(RANK + 1), device=device)
    sync_opts = dist.AllreduceOptions()
    sync_opts.asyncOp = False
    assert pg.allreduce([t], sync_opts) is None
    close(t, torch.full((3,), float(WS * (WS + 1) // 2)), "synchronous all_reduce, no Work")
    async_opts = dist.AllreduceOptions()
    work = pg.allreduce([t], async_opts)
    assert work is not None and work.wait(), work
    close(t, torch.full((3,), float(WS * WS * (WS + 1) // 2)), "asynchronous all_reduce, its Work")
    bad = dist.BroadcastOptions()
    bad.rootRank, bad.asyncOp = WS + 3, False
    expect_error(lambda: pg.broadcast([t], bad), ValueError, "is not a rank of this group")
    # batch_isend_irecv where both sides send first, large messages
    n = 400_000
    for _ in range(2):
        out = torch.empty(n, device=device)
        ops = [dist.P2POp(dist.isend, make(RANK, n, torch.float32).to(device), peer),
               dist.P2POp(dist.irecv, out, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        close(out, make(peer, n, torch.float32), "batch_isend_irecv")
    # isend/irecv ring
    nxt, prv = (RANK + 1) % WS, (RANK - 1) % WS
    buf = torch.empty(5, dtype=torch.int64, device=device)
    ws_ = [dist.isend(torch.full((5,), RANK, device=device), nxt), dist.irecv(buf, prv)]
    for w in ws_:
        w.wait()
    close(buf, torch.full((5,), prv), "isend/irecv ring")
    # coalesced variants
    ts = [make(RANK, k, torch.float32).to(device) for k in (3, 0, 9)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for k, t in zip((3, 0, 9), ts):
        close(t, reference([make(r, k, torch.float32) for r in range(WS)], R.SUM), "coalesced all_reduce")
    ins = [make(RANK, k, torch.float32).to(device) for k in (4, 6)]
    outs = [torch.empty(k * WS, device=device) for k in (4, 6)]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    for k, o in zip((4, 6), outs):
        close(o, torch.cat([make(r, k, torch.float32) for r in range(WS)]), "coalesced all_gather")
    rs_in = [make(RANK, k * WS, torch.float32, salt=2).to(device) for k in (4, 6)]
    rs_out = [torch.empty(k, device=device) for k in (4, 6)]
    with dist._coalescing_manager():
        for o, i in zip(rs_out, rs_in):
            dist.reduce_scatter_tensor(o, i)
    for k, o in zip((4, 6), rs_out):
        full = reference([make(r, k * WS, torch.float32, salt=2) for r in range(WS)], R.SUM)
        close(o, full[RANK * k:(RANK + 1) * k], "coalesced reduce_scatter")
    # object collectives
    objs = [None] * WS
    dist.all_gather_object(objs, {"rank": RANK, "s": "x" * RANK})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(WS)], objs
    lst = [RANK * 10, "b"] if RANK == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0, "b"], lst
    got = [None]
    dist.scatter_object_list(got, [f"o{r}" for r in range(WS)] if RANK == 0 else None, src=0)
    assert got == [f"o{RANK}"], got
    gl = [None] * WS if RANK == 0 else None
    dist.gather_object(("g", RANK), gl, dst=0)
    if RANK == 0:
        assert gl == [("g", r) for r in range(WS)], gl
    # non-contiguous tensors: a transposed view in, result written back into the view
    base = make(RANK, 12, torch.float32).view(3, 4).to(device)
    view = base.t()
    dist.all_reduce(view)
    want = reference([make(r, 12, torch.float32).view(3, 4) for r in range(WS)], R.SUM)
    close(base, want, "non-contiguous all_reduce")
    out = torch.empty(4, 2 * WS, device=device)
    dist.all_gather_into_tensor(out.t(), torch.full((2, 4), float(RANK), device=device))
    close(out.t().contiguous().view(WS, 2, 4)[:, 0, 0], torch.arange(WS, dtype=torch.float32), "nc gather")
    # functional collectives (DTensor's path)
    import torch.distributed._functional_collectives as funcol
    g = dist.group.WORLD
    x = make(RANK, 8, torch.float32).to(device)
    close(funcol.all_reduce(x, "sum", g), reference([make(r, 8, torch.float32) for r in range(WS)], R.SUM), "funcol ar")
    close(funcol.all_gather_tensor(x, 0, g), torch.cat([make(r, 8, torch.float32) for r in range(WS)]), "funcol ag")
    full = make(RANK, 4 * WS, torch.float32).to(device)
    want = reference([make(r, 4 * WS, torch.float32) for r in range(WS)], R.SUM)[RANK * 4:(RANK + 1) * 4]
    close(funcol.reduce_scatter_tensor(full, "sum", 0, g), want, "funcol rs")
    a2a = funcol.all_to_all_single(torch.arange(WS, dtype=torch.float32, device=device) + 10 * RANK, None, None, g)
    close(a2a, torch.tensor([10.0 * r + RANK for r in range(WS)]), "funcol a2a")
    # async overlap: issue, compute, wait; futures carry the result
    t = torch.ones(1 << 16, device=device)
    w = dist.all_reduce(t, async_op=True)
    y = torch.randn(64, 64) @ torch.randn(64, 64)  # host compute while the op runs
    fut = w.get_future()
    res = fut.wait()
    if device == "npu":
        # NCCL's semantics: Future.wait() orders the current stream after the op, the host goes on.
        torch.npu.current_stream().synchronize()
    assert w.is_completed() and y.shape == (64, 64)
    close(res[0], torch.full((1 << 16,), float(WS)), "future value")
    # Overlap, deterministically: rank 1 joins only after rank 0 has finished host work issued after
    # its async op, so that op must have returned before completing and run in the background.
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(1000, device=device)
    if RANK == 0:
        w = dist.all_reduce(t, async_op=True)
        assert not w.is_completed(), "async all_reduce completed before its peers joined"
        y = (torch.randn(128, 128) @ torch.randn(128, 128)).sum()
        store.set("overlap_go", "1")
        w.wait()
    else:
        if RANK == 1:
            store.wait(["overlap_go"])
        dist.all_reduce(t)
    close(t, torch.full((1000,), float(WS)), "overlapped all_reduce")
    chained = dist.all_reduce(torch.ones(3, device=device), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    close(chained.wait(), torch.full((3,), 2.0 * WS), "future then")
    dist.barrier()
    dist.destroy_process_group()




@scenario
def npu_wait_on_stream():
    """NCCL's Work.wait() on npu tensors: under asynchronous launch it orders the current stream after the op
    and returns at once; work queued after it sees the result, and a failure reaches the next synchronization
    point. Blocking launch (or TORCH_HCCL_BLOCKING_WAIT=1) waits on the host."""
    import npudist

    init(timeout=5)
    on_stream = not npudist._C._launch_blocking() and os.environ.get("TORCH_HCCL_BLOCKING_WAIT", "0") == "0"
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(1000, device="npu")
    # The first call of an op with new shapes runs synchronously (docs/device.md): make `t * 3` a known one.
    (t * 3).cpu()
    if RANK == 0:
        w = dist.all_reduce(t, async_op=True)
        if not on_stream:
            store.set("wait_go", "1")
        w.wait()
        assert w.is_completed() != on_stream, f"is_completed()={w.is_completed()} after wait(), on_stream={on_stream}"
        u = t * 3  # queued behind the collective on the current stream
        store.set("wait_go", "1")
        close(u, torch.full((1000,), 3.0 * WS), "work queued after wait()")
        assert w.is_completed()
    else:
        if RANK == 1:
            store.wait(["wait_go"])
        dist.all_reduce(t)
    close(t, torch.full((1000,), float(WS)), "all_reduce")
    # The same wait through a different stream: the waiting stream, not the issuing one, is ordered.
    side = torch.npu.Stream()
    x = torch.full((64,), float(RANK), device="npu")
    w = dist.all_reduce(x, async_op=True)
    with torch.npu.stream(side):
        w.wait()
        y = x + 1
    torch.npu.current_stream().wait_stream(side)
    close(y, torch.full((64,), float(sum(range(WS)) + 1)), "wait() on a side stream")
    if on_stream:
        # A failed collective: wait() returns, the next synchronization point raises, naming the op.
        bad = (dist.all_reduce(torch.ones(8, device="npu"), async_op=True) if RANK == 0
               else dist.all_gather_into_tensor(torch.empty(8 * WS, device="npu"), torch.ones(8, device="npu"),
                                                async_op=True))
        bad.wait()
        expect_error(torch.npu.synchronize, RuntimeError, "mismatched", "TORCH_HCCL_BLOCKING_WAIT")
    dist.destroy_process_group()


@scenario
def async_wait_out_of_order():
    """Waiting on the last of several queued async collectives first runs them all, in issue order."""
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    init()
    for _ in range(20):
        ts = [torch.full((1 << 12,), float(RANK + k), device=device) for k in range(4)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        works[-1].wait()
        if device == "npu":
            # On npu tensors wait() may only order the current stream after the op (npu_wait_on_stream).
            torch.npu.current_stream().synchronize()
        assert all(w.is_completed() for w in works), "earlier queued ops did not complete with the last one"
        for k, (w, t) in enumerate(zip(works, ts)):
            w.wait()
            close(t, torch.full((1 << 12,), float(sum(range(WS)) + WS * k)), f"async all_reduce {k}")
        # A broadcast after queued all_reduces must see their results (order kept across run_here and lane).
        w1 = dist.all_reduce(ts[0], async_op=True)
        w2 = dist.broadcast(ts[0], src=0, async_op=True)
        w2.wait()
        w1.wait()
        close(ts[0], torch.full((1 << 12,), float(WS * sum(range(WS)))), "all_reduce then broadcast")
    dist.barrier()
    dist.destroy_process_group()
