"""Worker for test_mc2_quant_ops: every rank builds all ranks' inputs from fixed seeds and computes the documented
formula (gathered / summed over the ranks) locally on cpu, to compare with the operators' results."""
from __future__ import annotations

import traceback

import torch
import torch.distributed as dist


def _ints(world, shape, seed):
    return [torch.randint(-128, 128, shape, generator=torch.Generator().manual_seed(seed + r), dtype=torch.int8)
            for r in range(world)]


def _floats(world, shape, seed, scale=1.0):
    return [torch.rand(shape, generator=torch.Generator().manual_seed(seed + r)) * scale + 0.01 for r in range(world)]


def _check(results, name, got, want, **tol):
    ok = tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype and \
        torch.allclose(got.cpu().double(), want.double(), **(tol or dict(rtol=1e-6, atol=1e-6)))
    results[name] = (bool(ok), float((got.cpu().double() - want.double()).abs().max()), tuple(got.shape))


def cases(results, rank, world, hcom, dev):
    import torch_npu
    m, k, n = 4, 16, 6
    # int8: per-token x1 scales (gathered with x1), per-channel x2 scales, bias, y_dtype float32
    xs, w = _ints(world, (m, k), 10), _ints(1, (k, n), 20)[0]
    s1s, s2, b = _floats(world, (m, 1), 30, 0.01), _floats(1, (1, n), 40, 0.01)[0], _floats(1, (n,), 50)[0]
    out, gathered, amax = torch_npu.npu_all_gather_quant_mm(
        xs[rank].to(dev), w.to(dev), hcom, world, bias=b.to(dev), x1_scale=s1s[rank].to(dev), x2_scale=s2.to(dev),
        y_dtype=torch.float32)
    full, s1 = torch.cat(xs), torch.cat(s1s)
    want = ((full.double() @ w.double()) * s1.double() * s2.double() + b.double()).float()
    _check(results, "all_gather int8 output", out, want)
    results["all_gather int8 gather_out"] = (torch.equal(gathered.cpu(), full), 0.0, tuple(gathered.shape))
    results["all_gather amax empty"] = (tuple(amax.shape) == (0,), 0.0, tuple(amax.shape))
    # float8 per tensor, bfloat16 output, no gather output
    f8 = [t.float().div(20).to(torch.float8_e4m3fn) for t in _ints(world, (m, k), 60)]
    w8 = _ints(1, (k, n), 70)[0].float().div(30).to(torch.float8_e4m3fn)
    out, gathered, _ = torch_npu.npu_all_gather_quant_mm(
        f8[rank].to(dev), w8.to(dev), hcom, world, x1_scale=torch.tensor([0.5]).to(dev),
        x2_scale=torch.tensor([4.0]).to(dev), gather_output=False, y_dtype=torch.bfloat16)
    want = (torch.cat(f8).double() @ w8.double() * 2.0).to(torch.bfloat16)
    _check(results, "all_gather float8 output", out, want)
    results["all_gather float8 no gather_out"] = (tuple(gathered.shape) == (0,), 0.0, tuple(gathered.shape))
    # bfloat16 without scales
    xb, wb = [t.bfloat16() for t in _floats(world, (m, k), 80)], _floats(1, (k, n), 90)[0].bfloat16()
    out, _, _ = torch_npu.npu_all_gather_quant_mm(xb[rank].to(dev), wb.to(dev), hcom, world)
    _check(results, "all_gather bfloat16 output", out, torch.cat(xb) @ wb, rtol=2e-2, atol=2e-2)
    # reduce-scatter int8 (m divisible by world): each rank's scaled product + bias, summed, rows split by rank
    rows = 2 * world
    xr, s1r = _ints(world, (rows, k), 100), _floats(world, (rows, 1), 110, 0.01)
    out, amax = torch_npu.npu_quant_mm_reduce_scatter(xr[rank].to(dev), w.to(dev), hcom, world, bias=b.to(dev),
                                                      x1_scale=s1r[rank].to(dev), x2_scale=s2.to(dev),
                                                      y_dtype=torch.float32)
    total = sum((x.double() @ w.double()) * s.double() * s2.double() + b.double() for x, s in zip(xr, s1r))
    per = rows // world
    _check(results, "reduce_scatter int8 output", out, total[rank * per:(rank + 1) * per].float(), rtol=1e-5,
           atol=1e-5)
    results["reduce_scatter amax empty"] = (tuple(amax.shape) == (0,), 0.0, tuple(amax.shape))
    xh, wh = [t.half() for t in _floats(world, (rows, k), 120)], _floats(1, (k, n), 130)[0].half()
    out, _ = torch_npu.npu_quant_mm_reduce_scatter(xh[rank].to(dev), wh.to(dev), hcom, world)
    total = sum(x.float() @ wh.float() for x in xh)
    _check(results, "reduce_scatter float16 output", out, total[rank * per:(rank + 1) * per].half(), rtol=2e-2,
           atol=2e-2)
    # refusals name the operator and the argument
    for name, call in (
            ("amax_output", lambda: torch_npu.npu_all_gather_quant_mm(xs[rank].to(dev), w.to(dev), hcom, world,
                                                                      x1_scale=s1s[rank].to(dev),
                                                                      x2_scale=s2.to(dev), y_dtype=torch.float32,
                                                                      amax_output=True)),
            ("y_dtype", lambda: torch_npu.npu_quant_mm_reduce_scatter(xr[rank].to(dev), w.to(dev), hcom, world,
                                                                      x1_scale=s1r[rank].to(dev),
                                                                      x2_scale=s2.to(dev))),
            ("x1_dtype", lambda: torch_npu.npu_all_gather_quant_mm(xs[rank].to(dev), w.to(dev), hcom, world,
                                                                   x1_dtype=290))):
        try:
            call()
            results[f"refuses {name}"] = (False, 0.0, "no error")
        except ValueError as e:
            results[f"refuses {name}"] = (name in str(e) and "quant" in str(e), 0.0, str(e))
    # compiled (fullgraph) through the fake kernels
    ops = torch.ops.npu

    def step(x, s):
        a, _, _ = ops.npu_all_gather_quant_mm(x, w.to(dev), hcom, world, x1_scale=s, x2_scale=s2.to(dev),
                                              y_dtype=torch.float32)
        return a * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    _check(results, "compiled equals eager", compiled(xs[rank].to(dev), s1s[rank].to(dev)),
           step(xs[rank].to(dev), s1s[rank].to(dev)).cpu())


def run(rank, world, out_path):
    import torch_npu  # noqa: F401  (get_hccl_comm_name)
    torch.npu.set_device(rank)
    dist.init_process_group("hccl", rank=rank, world_size=world)
    results = {}
    try:
        dev = torch.device("npu", rank)
        hcom = dist.group.WORLD._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
        cases(results, rank, world, hcom, dev)
        torch.npu.synchronize()
    except Exception:  # noqa: BLE001 - reported to the test with the traceback
        results["worker"] = (False, 0.0, traceback.format_exc())
    torch.save(results, f"{out_path}.{rank}")
    dist.barrier()
    dist.destroy_process_group()
