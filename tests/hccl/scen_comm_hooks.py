"""Scenarios: Work futures with NCCL's semantics, PyTorch's DDP communication hooks, DDP join() with uneven
inputs and DDP's compute-time statistics, on npu and cpu tensors over hccl.

Every hook trains a model next to a DDP model without a hook (same data, same group) and the parameters must
agree within the hook's own tolerance (the hook's compression error, not a loose bound for all).
"""
from __future__ import annotations

import copy
import sys
import threading
import time

import torch
import torch.distributed as dist

from common import RANK, WS, close, init, scenario


def _device() -> str:
    return sys.argv[2] if len(sys.argv) > 2 else "npu"


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batch(g: torch.Generator, rank: int, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s batch of this step (every rank draws every rank's batch, so inputs differ per rank)."""
    xs = [(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for _ in range(WS)]
    x, y = xs[rank]
    return x.to(dev), y.to(dev)


def _reduce_twice(f):
    """A then() callback as PowerSGD's: issues all_reduces of the same group and waits on their futures."""
    v = f.value()
    v = v[0] if isinstance(v, list) else v
    for _ in range(2):
        v = dist.all_reduce(v.clone(), async_op=True).get_future().wait()[0]
    return v


@scenario
def future_semantics():
    """get_future(): on npu complete at launch with the value ordered on the stream, then() callbacks run on the
    caller; on cpu complete with the op, callbacks off the group's worker. Either way a callback may issue and
    wait on ops of the same group, and value() is readable right after Work.wait()."""
    dev = _device()
    init()
    want = float(sum(r + 1 for r in range(WS)))
    for late in (False, True):
        dist.barrier()
        if late and RANK != 0:
            # Rank 0 attaches its callbacks before its peers issue: they run where the op completes.
            time.sleep(0.5)
        t = torch.full((4096,), float(RANK + 1), device=dev)
        fut = dist.all_reduce(t, async_op=True).get_future()
        if dev == "npu":
            assert fut.done(), "the future of an npu op completes when the op is issued (NCCL's semantics)"
        caller = threading.get_ident()
        ran_on = []

        def first(f):
            ran_on.append(threading.get_ident())
            return _reduce_twice(f)

        out = fut.then(first).then(_reduce_twice).wait()
        close(out.cpu(), torch.full((4096,), want * WS ** 4), f"nested callbacks (peers late: {late})")
        close(t.cpu(), torch.full((4096,), want), "all_reduce value")
        if dev == "npu":
            assert ran_on == [caller], "then() on a completed npu future runs on the caller, as NCCL's"
        elif late and RANK == 0:
            assert ran_on and ran_on[0] != caller, "the callback ran on a completion thread"

        # DDP's join() pattern: the future's value is read right after Work.wait().
        u = torch.full((1024,), float(RANK + 1), device=dev)
        w = dist.all_reduce(u, async_op=True)
        w.wait()
        close(w.get_future().value()[0].cpu(), torch.full((1024,), want), "future value right after wait()")
    dist.destroy_process_group()


def _powersgd_state(group=None, **kw):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    # Full rank (the model's matrices are at most 16 x 8) and compression from the 2nd step on, for every
    # matrix: the low-rank product then reproduces the gradient, and the hook's nested all_reduces run.
    return ps.PowerSGDState(process_group=group, matrix_approximation_rank=16, start_powerSGD_iter=2,
                            min_compression_rate=0, use_error_feedback=True, warm_start=True, **kw)


def _with_hook(name: str, model: torch.nn.Module, ddp_kwargs: dict):
    """The DDP model with hook `name` and its optimizer; the no-hook model is trained next to it."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pl
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, **ddp_kwargs)
    if name == "optimizer_overlap":
        # The optimizer steps inside the hook's then() callback, per bucket (DDP's fused optimizer).
        ddp._register_fused_optim(torch.optim.SGD, lr=0.1)
        return ddp, None
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    if name == "allreduce":
        ddp.register_comm_hook(None, dh.allreduce_hook)
    elif name == "fp16_compress":
        ddp.register_comm_hook(None, dh.fp16_compress_hook)
    elif name == "bf16_compress":
        # DDP refuses the hook under its own name unless CUDA + NCCL >= 2.10 or XPU + XCCL
        # (DistributedDataParallel._check_comm_hook, torch 2.13); the same function under another name runs.
        def bf16_allreduce(state, bucket):
            return dh.bf16_compress_hook(state, bucket)

        ddp.register_comm_hook(None, bf16_allreduce)
    elif name == "fp16_wrapper_allreduce":
        ddp.register_comm_hook(None, dh.fp16_compress_wrapper(dh.allreduce_hook))
    elif name == "powerSGD":
        ddp.register_comm_hook(_powersgd_state(), ps.powerSGD_hook)
    elif name == "powerSGD_fp16_wrapper":
        ddp.register_comm_hook(_powersgd_state(), dh.fp16_compress_wrapper(ps.powerSGD_hook))
    elif name == "post_localSGD":
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer

        # The local subgroup is the whole world, so local SGD averages what global SGD would: the hook's
        # subgroup all_reduce (from step 2 on) and the averager run, and the result equals plain DDP.
        state = pl.PostLocalSGDState(process_group=None, subgroup=dist.new_group(list(range(WS))),
                                     start_localSGD_iter=2)
        ddp.register_comm_hook(state, pl.post_localSGD_hook)
        opt = PostLocalSGDOptimizer(opt, PeriodicModelAverager(period=2, warmup_steps=2))
    else:
        raise ValueError(f"unknown hook {name!r}")
    return ddp, opt


# The hook's own error against no hook after STEPS steps of SGD (lr 0.1): fp32 reordering for hooks that move
# fp32, a rounding of each gradient to fp16 (2^-11 relative) or bf16 (2^-8) per step for the compressing ones.
TOLERANCE = {"allreduce": 1e-5, "optimizer_overlap": 1e-5, "post_localSGD": 1e-5, "powerSGD": 1e-5,
             "fp16_compress": 1e-4, "fp16_wrapper_allreduce": 1e-4, "powerSGD_fp16_wrapper": 1e-3,
             "bf16_compress": 1e-3}
STEPS = 6


@scenario
def comm_hook():
    """argv: <device> <hook>: DDP with the hook trains like DDP without it, within the hook's tolerance."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev, name = sys.argv[2], sys.argv[3]
    init()
    base = _model()
    kwargs = {"device_ids": None}
    plain = DDP(copy.deepcopy(base).to(dev))
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    hooked, opt = _with_hook(name, copy.deepcopy(base).to(dev), kwargs)
    g = torch.Generator().manual_seed(42)
    for _ in range(STEPS):
        x, y = _batch(g, RANK, dev)
        plain_opt.zero_grad()
        torch.nn.functional.mse_loss(plain(x), y).backward()
        plain_opt.step()
        if opt is not None:
            opt.zero_grad()
        else:
            hooked.zero_grad()  # the fused optimizer steps in the hook; gradients still accumulate
        torch.nn.functional.mse_loss(hooked(x), y).backward()
        if opt is not None:
            opt.step()
    worst = 0.0
    for (pname, p), q in zip(hooked.module.named_parameters(), plain.module.parameters()):
        assert p.device.type == dev
        diff = (p.detach().cpu() - q.detach().cpu()).abs().max().item()
        worst = max(worst, diff)
        assert diff <= TOLERANCE[name], f"{name} on {dev}: {pname} differs from no hook by {diff}"
    print(f"hook {name} on {dev}: max difference {worst:.3g}", flush=True)
    # The ranks agree bitwise (every rank applied the same reduced gradient).
    flat = torch.cat([p.detach().cpu().flatten() for p in hooked.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(WS)]
    dist.all_gather(gathered, flat)
    for r, other in enumerate(gathered):
        assert torch.equal(other, flat), f"{name}: rank {r}'s parameters differ from rank {RANK}'s"
    dist.destroy_process_group()


@scenario
def join_uneven():
    """DDP join() with uneven inputs (rank r has 3 + r batches) ends with the parameters of single-process
    SGD on, per step, the sum of the gradients of the ranks still training divided by the world size."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _device()
    hook = sys.argv[3] if len(sys.argv) > 3 else ""
    init()
    base = _model()
    ddp = DDP(copy.deepcopy(base).to(dev))
    if hook == "powerSGD":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        ddp.register_comm_hook(_powersgd_state(), ps.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    steps = [3 + r for r in range(WS)]
    g = torch.Generator().manual_seed(7)
    batches = [[_batch(g, r, "cpu") for r in range(WS)] for _ in range(max(steps))]
    with Join([ddp]):
        for i in range(steps[RANK]):
            x, y = batches[i][RANK]
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x.to(dev)), y.to(dev)).backward()
            opt.step()
    ref = copy.deepcopy(base)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for i in range(max(steps)):
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for r in range(WS):
            if i < steps[r]:
                ref.zero_grad()
                x, y = batches[i][r]
                torch.nn.functional.mse_loss(ref(x), y).backward()
                for acc, p in zip(grads, ref.parameters()):
                    acc += p.grad
        for acc, p in zip(grads, ref.parameters()):
            p.grad = acc / WS
        ref_opt.step()
    tol = 1e-4 if hook else 1e-5
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        diff = (p.detach().cpu() - q.detach()).abs().max().item()
        assert diff <= tol, f"join on {dev}{' with ' + hook if hook else ''}: {name} differs by {diff}"
    dist.destroy_process_group()


@scenario
def ddp_timer():
    """DDP's logging data on npu has forward/backward compute and communication times (a c10d Timer for the
    npu): positive, and each within the host's wall time of the iterations."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    init()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).npu()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(32, 64, device="npu"), torch.randn(32, 64, device="npu")
    start = time.perf_counter_ns()
    for _ in range(4):  # DDP logs runtime statistics of its first iterations at the next forward
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    ddp(x)
    torch.npu.synchronize()
    wall = time.perf_counter_ns() - start
    data = ddp._get_ddp_logging_data()
    for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
        assert key in data, f"DDP logging data has no {key}: {sorted(data)}"
        assert 0 < data[key] < wall, f"{key} = {data[key]} ns (wall time of the iterations: {wall} ns)"
    assert "avg_backward_compute_comm_overlap_time" in data, sorted(data)
    print({k: v for k, v in data.items() if k.startswith("avg_")}, flush=True)
    dist.destroy_process_group()
