"""Worker for test_mc2_ops: every rank builds all ranks' inputs from fixed seeds, so the reference (the
documented collective + matmul) is computed locally on cpu from the whole data, with no collective at all."""
from __future__ import annotations

import traceback

import torch
import torch.distributed as dist


def _inputs(world, shape, seed, dtype):
    """Rank r's tensor for each r: the same on every rank."""
    return [torch.randn(shape, generator=torch.Generator().manual_seed(seed + r), dtype=torch.float32).to(dtype)
            for r in range(world)]


def _close(got, want, dtype):
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    return torch.allclose(got.cpu().float(), want.float(), **tol), (got.cpu().float() - want.float()).abs().max()


def _check(results, name, got, want, dtype):
    ok, err = _close(got, want, dtype)
    results[name] = (bool(ok) and tuple(got.shape) == tuple(want.shape), float(err), tuple(got.shape))


def all_gather_cases(results, rank, world, hcom, dev):
    ops = torch.ops.npu
    for m, dtype, bias, gather_output, transposed, mode in (
            (4, torch.float32, False, True, False, None),      # one chunk
            (96, torch.float32, True, True, False, "aiv"),     # three pipeline chunks, bias
            (70, torch.float32, False, False, True, "ai_cpu"), # uneven chunks, no gather output, x2 a transpose
            (64, torch.bfloat16, True, True, False, None)):
        k, n = 24, 40
        xs = _inputs(world, (m, k), 100 + m, dtype)
        w = _inputs(1, (n, k) if transposed else (k, n), 7, dtype)[0]
        w = w.t() if transposed else w
        b = _inputs(1, (n,), 9, dtype)[0] if bias else None
        out, gathered = ops.npu_all_gather_base_mm(
            xs[rank].to(dev), w.to(dev), hcom, world, bias=None if b is None else b.to(dev),
            gather_output=gather_output, comm_mode=mode)
        full = torch.cat(xs)
        want = (full.float() @ w.float() + (b.float() if b is not None else 0)).to(dtype)
        tag = f"all_gather m={m} {dtype} bias={bias} gather_output={gather_output} transposed={transposed}"
        _check(results, tag + " output", out, want, dtype)
        if gather_output:
            _check(results, tag + " gather_out", gathered, full, dtype)
        else:
            results[tag + " gather_out empty"] = (tuple(gathered.shape) == (0,), 0.0, tuple(gathered.shape))
    # gather_index=1: x2 is gathered (rank-major along its rows) and input multiplies the gathered x2
    x = _inputs(1, (12, 16 * world), 3, torch.float32)[0]
    ws = _inputs(world, (16, 10), 30, torch.float32)
    b = _inputs(1, (10,), 31, torch.float32)[0]
    out, gathered = ops.npu_all_gather_base_mm(x.to(dev), ws[rank].to(dev), hcom, world, bias=b.to(dev),
                                               gather_index=1)
    _check(results, "all_gather gather_index=1 output", out, x @ torch.cat(ws) + b, torch.float32)
    _check(results, "all_gather gather_index=1 gather_out", gathered, torch.cat(ws), torch.float32)


def reduce_scatter_cases(results, rank, world, hcom, dev):
    ops = torch.ops.npu
    for rows, dtype, bias, transposed in ((3, torch.float32, False, False), (80, torch.float32, True, True),
                                          (64, torch.bfloat16, False, False)):
        m, k, n = rows * world, 20, 36
        xs = _inputs(world, (m, k), 200 + rows, dtype)
        w = _inputs(1, (n, k) if transposed else (k, n), 8, dtype)[0]
        w = w.t() if transposed else w
        b = _inputs(1, (n,), 10, dtype)[0] if bias else None
        out = ops.npu_mm_reduce_scatter_base(xs[rank].to(dev), w.to(dev), hcom, world, reduce_op="sum",
                                             bias=None if b is None else b.to(dev))
        partials = [x.float() @ w.float() + (b.float() if b is not None else 0) for x in xs]
        want = sum(partials).chunk(world)[rank].to(dtype)
        _check(results, f"reduce_scatter rows={rows} {dtype} bias={bias} transposed={transposed}", out, want, dtype)


def all_reduce_cases(results, rank, world, hcom, dev, group=""):
    ops = torch.ops.npu
    for shape, dtype, bias, x3 in (((5, 24), torch.float32, False, False), ((2, 70, 24), torch.float32, True, True),
                                   ((128, 24), torch.bfloat16, True, False)):
        n = 18
        xs = _inputs(world, shape, 300 + shape[0], dtype)
        w = _inputs(world, (24, n), 40, dtype)
        b = _inputs(world, (n,), 50, dtype) if bias else None
        x3s = _inputs(world, (*shape[:-1], n), 60, dtype) if x3 else None
        out = ops.npu_mm_all_reduce_base(xs[rank].to(dev), w[rank].to(dev), hcom,
                                         bias=None if b is None else b[rank].to(dev),
                                         x3=None if x3s is None else x3s[rank].to(dev))
        want = sum(xs[r].float() @ w[r].float() + (b[r].float() if b else 0) + (x3s[r].float() if x3s else 0)
                   for r in range(world)).to(dtype)
        _check(results, f"{group}all_reduce shape={shape} {dtype} bias={bias} x3={x3}", out, want, dtype)


def error_cases(results, rank, world, hcom, dev):
    x, w = torch.randn(8, 16, device=dev), torch.randn(16, 4, device=dev)
    ops = torch.ops.npu
    calls = {
        "ag world_size not the group's": lambda: ops.npu_all_gather_base_mm(x, w, hcom, 4),
        "ag world_size 3": lambda: ops.npu_all_gather_base_mm(x, w, hcom, 3),
        "ag gather_index 2": lambda: ops.npu_all_gather_base_mm(x, w, hcom, world, gather_index=2),
        "ag comm_turn 1": lambda: ops.npu_all_gather_base_mm(x, w, hcom, world, comm_turn=1),
        "ag comm_mode": lambda: ops.npu_all_gather_base_mm(x, w, hcom, world, comm_mode="fast"),
        "ag x1_scale": lambda: ops.npu_all_gather_base_mm(x, w, hcom, world, x1_scale=torch.ones(8, 1, device=dev)),
        "ag k mismatch": lambda: ops.npu_all_gather_base_mm(x, w.t(), hcom, world),
        "ag dtype mismatch": lambda: ops.npu_all_gather_base_mm(x, w.double(), hcom, world),
        "ag bad bias": lambda: ops.npu_all_gather_base_mm(x, w, hcom, world, bias=torch.ones(5, device=dev)),
        "ag unknown hcom": lambda: ops.npu_all_gather_base_mm(x, w, "no-such-group", world),
        "rs reduce_op max": lambda: ops.npu_mm_reduce_scatter_base(x, w, hcom, world, reduce_op="max"),
        "rs rows": lambda: ops.npu_mm_reduce_scatter_base(x[:7], w, hcom, world),
        "rs world_size": lambda: ops.npu_mm_reduce_scatter_base(x, w, hcom, 8),
        "rs output_dtype": lambda: ops.npu_mm_reduce_scatter_base(x, w, hcom, world, output_dtype=torch.float16),
        "ar reduce_op": lambda: ops.npu_mm_all_reduce_base(x, w, hcom, reduce_op="prod"),
        "ar x3 shape": lambda: ops.npu_mm_all_reduce_base(x, w, hcom, x3=torch.ones(8, 5, device=dev)),
        "ar 4-D x1": lambda: ops.npu_mm_all_reduce_base(x.view(1, 2, 4, 16), w, hcom),
        "ar antiquant": lambda: ops.npu_mm_all_reduce_base(x, w, hcom, antiquant_scale=torch.ones(4, device=dev)),
        "ar comm_turn": lambda: ops.npu_mm_all_reduce_base(x, w, hcom, comm_turn=2),
    }
    names = {"ag": "npu_all_gather_base_mm", "rs": "npu_mm_reduce_scatter_base", "ar": "npu_mm_all_reduce_base"}
    for tag, call in calls.items():
        try:
            call()
            results["error " + tag] = (False, 0.0, "no error")
        except ValueError as e:
            results["error " + tag] = (names[tag[:2]] in str(e), 0.0, str(e)[:200])
        except Exception as e:  # noqa: BLE001 - any other type is the failure being reported
            results["error " + tag] = (False, 0.0, f"{type(e).__name__}: {e}"[:200])


def autograd_profiler_compile_cases(results, rank, world, hcom, dev):
    ops = torch.ops.npu
    x = torch.randn(4, 8, device=dev)
    w = torch.randn(8, 6, device=dev, requires_grad=True)
    # torch_npu registers no backward for these operators: backpropagating through one is an error naming it
    out, _ = ops.npu_all_gather_base_mm(x, w, hcom, world)
    try:
        out.sum().backward()
        results["no backward"] = (False, 0.0, "backward ran")
    except RuntimeError as e:
        results["no backward"] = ("all_gather_base_mm" in str(e), 0.0, str(e)[:200])
    w = w.detach()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ops.npu_all_gather_base_mm(x, w, hcom, world)
        ops.npu_mm_reduce_scatter_base(torch.randn(4, 8, device=dev), w, hcom, world)
        ops.npu_mm_all_reduce_base(x, w, hcom)
    names = {e.name for e in prof.events()}
    for op in ("npu_all_gather_base_mm", "npu_mm_reduce_scatter_base", "npu_mm_all_reduce_base"):
        results[f"profiler shows {op}"] = (f"npu::{op}" in names, 0.0, sorted(n for n in names if "npu::" in n))

    def step(a, b):
        y, g = ops.npu_all_gather_base_mm(a, b, hcom, world)
        z = ops.npu_mm_reduce_scatter_base(torch.relu(y), b.t(), hcom, world)
        return ops.npu_mm_all_reduce_base(z, b, hcom, bias=b[0]) + g.sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    a, b = torch.randn(6, 8, device=dev), torch.randn(8, 8, device=dev)
    _check(results, "compiled (aot_eager, fullgraph) equals eager", compiled(a, b), step(a, b).cpu(), torch.float32)
    torch._dynamo.reset()
    inductor = torch.compile(step, fullgraph=True)
    _check(results, "compiled (inductor, fullgraph) equals eager", inductor(a, b), step(a, b).cpu(), torch.float32)


def run(rank, world, out_path):
    import torch_npu  # noqa: F401  (the names torch_npu's callers use: get_hccl_comm_name)
    from npudist.ops import mc2
    mc2._MAX_CHUNKS = 4   # the pipelined path (up to 4 chunks; the small cases stay at one chunk)
    torch.npu.set_device(rank)
    dist.init_process_group("hccl", rank=rank, world_size=world)
    results = {}
    try:
        dev = torch.device("npu", rank)
        hcom = dist.group.WORLD._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
        all_gather_cases(results, rank, world, hcom, dev)
        reduce_scatter_cases(results, rank, world, hcom, dev)
        all_reduce_cases(results, rank, world, hcom, dev)
        # a second group of the same ranks has its own name; the operators find it by that name
        sub = dist.new_group(list(range(world)))
        sub_hcom = sub._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
        results["subgroup has its own name"] = (sub_hcom != hcom, 0.0, sub_hcom)
        all_reduce_cases(results, rank, world, sub_hcom, dev, group="subgroup ")
        error_cases(results, rank, world, hcom, dev)
        autograd_profiler_compile_cases(results, rank, world, hcom, dev)
        torch.npu.synchronize()
    except Exception:  # noqa: BLE001 - reported to the test with the traceback
        results["worker"] = (False, 0.0, traceback.format_exc())
    torch.save(results, f"{out_path}.{rank}")
    dist.barrier()
    dist.destroy_process_group()
