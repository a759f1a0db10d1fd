"""One rank of a multi-process hccl test scenario (started by tests/hccl/launcher.py).

Usage: worker.py <scenario> [args...]; RANK/WORLD_SIZE/HCCL_TEST_STORE come from the environment.
Each scenario checks results against references computed locally (every rank can rebuild every rank's
input from its seed) and prints "SCENARIO OK" at the end.
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import npudist  # noqa: F401  (registers the npu device and the hccl backend)

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def init(backend="hccl", timeout=60.0, **kw):
    dist.init_process_group(backend, init_method="file://" + os.environ["HCCL_TEST_STORE"], rank=RANK,
                            world_size=WS, timeout=timedelta(seconds=timeout), **kw)
    expect = os.environ.get("HCCL_TEST_EXPECT_NODES")
    if expect and backend == "hccl":
        be = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert be.num_nodes == int(expect) and be.uses_gloo, (be.num_nodes, be.uses_gloo)


# ------------------------------------------------------------------------------------------------
# Inputs and references

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
COMPLEX = [torch.complex64, torch.complex128]
ALL_DTYPES = FLOATS + INTS + [torch.bool] + COMPLEX
R = dist.ReduceOp


def make(rank: int, n: int, dtype: torch.dtype, salt: int = 0, small: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + 7 * salt + n)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float64)
        return (x * 0.5 + 1.0 if small else x).to(dtype)
    if dtype.is_complex:
        return torch.randn(n, generator=g, dtype=dtype)
    lo, hi = (1, 3) if small else ((0, 10) if dtype == torch.uint8 else (-5, 6))
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def reference(xs: list[torch.Tensor], op) -> torch.Tensor:
    dtype = xs[0].dtype
    s = torch.stack(xs)
    if dtype == torch.bool:
        if op in (R.SUM, R.MAX, R.BOR):
            return s.any(0)
        if op in (R.PRODUCT, R.MIN, R.BAND):
            return s.all(0)
        return (s.to(torch.int64).sum(0) % 2).bool()
    acc = torch.complex128 if dtype.is_complex else (torch.float64 if dtype.is_floating_point else torch.int64)
    w = s.to(acc)
    if op == R.SUM:
        r = w.sum(0)
    elif op == R.AVG:
        r = w.sum(0) / len(xs) if (dtype.is_floating_point or dtype.is_complex) else torch.div(
            w.sum(0), len(xs), rounding_mode="trunc")
    elif op == R.PRODUCT:
        r = w.prod(0)
    elif op == R.MIN:
        r = w.amin(0)
    elif op == R.MAX:
        r = w.amax(0)
    elif op in (R.BAND, R.BOR, R.BXOR):
        r = s[0].clone()
        for x in s[1:]:
            r = r & x if op == R.BAND else (r | x if op == R.BOR else r ^ x)
        return r
    else:
        raise AssertionError(op)
    return r.to(dtype)


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
    if dtype.is_complex:
        return [R.SUM, R.AVG]
    if dtype.is_floating_point:
        return [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, "PREMUL"]
    return [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if a.dtype in (torch.float16, torch.bfloat16):
        tol = dict(rtol=2e-2, atol=2e-2)
    elif a.dtype in (torch.float32, torch.complex64):
        tol = dict(rtol=1e-5, atol=1e-5)
    else:
        tol = dict(rtol=1e-12, atol=1e-12) if (a.is_floating_point() or a.is_complex()) else dict(rtol=0, atol=0)
    if not torch.allclose(a.to(torch.complex128) if a.is_complex() else a.double(),
                          b.to(torch.complex128) if b.is_complex() else b.double(), **tol):
        raise AssertionError(f"{what}: mismatch\n got {a[:8]}\nwant {b[:8]}")


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
                    want = (torch.stack(xs).double().sum(0) * 0.5).to(dtype)
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
        checks += 2
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
def groups():
    """new_group subgroups, several groups in flight, split_group, DeviceMesh sub-meshes, options."""
    from torch.distributed.device_mesh import init_device_mesh

    import npudist.hccl as hccl

    opts = hccl.ProcessGroupHCCL.Options()
    opts.hccl_config = {"hccl_buffer_size": 2}
    init(pg_options=opts, device_id=torch.device("npu", 0))
    world = dist.group.WORLD
    be = world._get_backend(torch.device("npu"))
    assert isinstance(be, hccl.ProcessGroupHCCL), type(be)
    assert be.buffer_bytes == 2 << 20, be.buffer_bytes
    assert be.num_nodes == 1 and not be.uses_gloo
    assert dist.get_backend() == "hccl"
    assert dist.Backend.default_device_backend_map["npu"] == "hccl"
    # Subgroups: evens and odds, each checked with the full all_reduce matrix on small sizes.
    evens, odds = list(range(0, WS, 2)), list(range(1, WS, 2))
    g_even = dist.new_group(evens, timeout=timedelta(seconds=30))
    g_odd = dist.new_group(odds)
    mine, ranks = (g_even, evens) if RANK % 2 == 0 else (g_odd, odds)
    if len(ranks) > 1:
        check_all_reduce_matrix("cpu", [1, 5], group=mine, ranks=ranks)
        check_other_collectives("npu", 3, group=mine, ranks=ranks)
    # Several groups in flight: async ops on the world and the subgroup interleaved, waited late.
    works, want = [], []
    for i in range(6):
        t = torch.full((1000,), float(RANK + i), device="npu")
        works.append((dist.all_reduce(t, group=world, async_op=True), t,
                      float(sum(r + i for r in range(WS)))))
        u = torch.full((10,), float(RANK * i))
        works.append((dist.all_reduce(u, group=mine, async_op=True), u, float(sum(r * i for r in ranks))))
    for w, t, v in works:
        w.wait()
        close(t, torch.full(t.shape, v), "groups in flight")
    # split_group
    sub = dist.split_group(split_ranks=[evens, odds])
    t = torch.ones(4, device="npu")
    dist.all_reduce(t, group=sub)
    close(t, torch.full((4,), float(len(ranks))), "split_group")
    sb = sub._get_backend(torch.device("npu"))
    assert isinstance(sb, hccl.ProcessGroupHCCL) and sb.buffer_bytes == 2 << 20
    # DeviceMesh sub-meshes (2 x WS/2): reduce along each dim
    if WS % 2 == 0 and WS >= 4:
        mesh = init_device_mesh("npu", (2, WS // 2), mesh_dim_names=("dp", "tp"))
        for dim in ("dp", "tp"):
            g = mesh.get_group(dim)
            members = dist.get_process_group_ranks(g)
            t = torch.full((3,), float(RANK), device="npu")
            dist.all_reduce(t, group=g)
            close(t, torch.full((3,), float(sum(members))), f"mesh {dim}")
    dist.destroy_process_group()


@scenario
def mixed_backends():
    """init_process_group("cpu:gloo,npu:hccl"): cpu tensors go to Gloo, npu tensors to hccl."""
    import npudist.hccl as hccl

    init("cpu:gloo,npu:hccl")
    world = dist.group.WORLD
    assert isinstance(world._get_backend(torch.device("npu")), hccl.ProcessGroupHCCL)
    assert not isinstance(world._get_backend(torch.device("cpu")), hccl.ProcessGroupHCCL)
    a, b = torch.full((5,), float(RANK)), torch.full((5,), float(RANK), device="npu")
    dist.all_reduce(a)
    dist.all_reduce(b)
    want = torch.full((5,), float(sum(range(WS))))
    close(a, want, "gloo cpu")
    close(b, want, "hccl npu")
    dist.destroy_process_group()


@scenario
def exec_timeout_env():
    """HCCL_EXEC_TIMEOUT sets the op timeout when init_process_group was given none."""
    dist.init_process_group("hccl", init_method="file://" + os.environ["HCCL_TEST_STORE"], rank=RANK,
                            world_size=WS)
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert be.timeout == timedelta(seconds=int(os.environ["HCCL_EXEC_TIMEOUT"])), be.timeout
    g = dist.new_group(timeout=timedelta(seconds=17))
    assert g._get_backend(torch.device("cpu")).timeout == timedelta(seconds=17)
    dist.destroy_process_group()


@scenario
def ddp():
    """DDP on npu with hccl (plus a communication hook through get_future) matches one process."""
    import copy

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    ddp_model = DDP(copy.deepcopy(model).npu())
    if len(sys.argv) > 2 and sys.argv[2] == "hook":
        ddp_model.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(42)
    for _ in range(4):
        x, y = torch.randn(4 * WS, 8, generator=g), torch.randn(4 * WS, 4, generator=g)
        shard = slice(RANK * 4, (RANK + 1) * 4)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp_model(x[shard].npu()), y[shard].npu()).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for (name, p), q in zip(ddp_model.module.named_parameters(), ref.parameters()):
        assert p.device.type == "npu"
        diff = (p.detach().cpu() - q.detach()).abs().max().item()
        assert diff < 1e-5, f"{name}: DDP differs from single-process training by {diff}"
    dist.destroy_process_group()


def expect_error(fn, types, *needles):
    import time as _t

    t0 = _t.monotonic()
    try:
        fn()
    except types as e:
        msg = str(e)
        for n in needles:
            assert n in msg, f"error text lacks {n!r}: {msg}"
        print(f"rank {RANK}: expected {type(e).__name__} after {_t.monotonic() - t0:.1f}s: {msg[:400]}",
              flush=True)
        return msg, _t.monotonic() - t0
    raise AssertionError(f"no {types} raised")


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
    for what in ("op", "size", "dtype"):
        g = dist.new_group(timeout=timedelta(seconds=10))
        with_group = {"op": lambda: (dist.all_reduce(torch.ones(8), group=g) if RANK == 0
                                     else dist.broadcast(torch.ones(8), 0, group=g)),
                      "size": lambda: dist.all_reduce(torch.ones(8 if RANK == 0 else 9), group=g),
                      "dtype": lambda: dist.all_reduce(
                          torch.ones(8, dtype=torch.float32 if RANK == 0 else torch.float64), group=g)}[what]
        msg, took = expect_error(with_group, dist.DistBackendError, "0", "1")
        assert took < 5, f"{what} mismatch took {took:.1f}s"
        dist.destroy_process_group(g)
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
    world_be = dist.group.WORLD._get_backend(torch.device("cpu"))
    expect_error(lambda: world_be.send([torch.ones(2)], RANK, 0), ValueError, "itself")
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
def stream_order():
    """npu ops are ordered after work already queued on the caller's current stream (sync and async),
    also on a non-default current stream."""
    from npudist import _C as device_c

    init()
    want = float(sum(r + 1 for r in range(WS)))
    side = torch.npu.Stream()
    for stream in (torch.npu.current_stream(), side):
        with torch.npu.stream(stream):
            sid = torch.npu.current_stream().npu_stream
            for mode in ("async", "sync"):
                t = torch.zeros(1000, device="npu")
                # A slow host function on the current stream writes the input; the op must see it.
                device_c._launch_host_fill(t, float(RANK + 1), 200_000, sid)
                if mode == "async":
                    dist.all_reduce(t, async_op=True).wait()
                else:
                    dist.all_reduce(t)
                close(t, torch.full((1000,), want), f"{mode} all_reduce after queued stream work")
    dist.destroy_process_group()


SCENARIO_ARGS = sys.argv[2:]

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    print("SCENARIO OK", flush=True)
