"""Rank bodies for the compiled FSDP2 / TP tests (run on spawned processes)."""
import copy

import torch
import torch.distributed as dist
from torch import nn


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))


def _train(model, x, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def compiled_parallel_worker(rank, world, layout):
    """Train 2 steps compiled under ``layout`` (fsdp | tp) and compare with eager single-process npu training."""
    import npudist  # noqa: F401  (npu device, hccl backend)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    try:
        mesh = init_device_mesh("npu", (world,))
        base = _model()
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).npu()  # same batch on every rank
        eager = copy.deepcopy(base).npu()
        model = copy.deepcopy(base).npu()
        if layout == "fsdp":
            # torchtitan's shape: compile each unit, FSDP hooks (all-gather / reduce-scatter) stay outside it.
            for i in (0, 2):
                model[i].compile()
                fully_shard(model[i], mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            # DTensor ops and their functional collectives are traced into the graph and run on hccl.
            parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
            model.compile(fullgraph=True)
        got, want = _train(model, x), _train(eager, x)
        for g, w in zip(got, want):
            assert g.device.type == "npu"
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            full = p.full_tensor() if isinstance(p, DTensor) else p
            torch.testing.assert_close(full, q.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    finally:
        dist.destroy_process_group()
