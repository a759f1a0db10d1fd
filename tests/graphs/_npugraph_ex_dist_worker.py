"""Rank bodies for the 2-rank npugraph_ex tests (run on spawned processes)."""
import copy

import torch
import torch.distributed as dist


def _block():
    from npudist.models.config import ModelConfig
    from npudist.models.llama import TransformerBlock, compute_rope_cache

    torch.manual_seed(0)
    cfg = ModelConfig(dim=32, n_heads=4, ffn_hidden_dim=64, max_seq_len=16)
    block = TransformerBlock(0, cfg)
    block.init_weights()
    cos, sin = compute_rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
    return block, cos[:8].npu(), sin[:8].npu()


def _train(block, cos, sin, data, params=None):
    # foreach=False: the norms stay plain tensors beside DTensor weights, which one foreach call cannot mix.
    opt = torch.optim.SGD(block.parameters() if params is None else params, lr=0.1, foreach=False)
    losses = []
    for x in data:
        loss = block(x, cos, sin).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def tp_block_worker(rank, world):
    """A TP x2 transformer block (all-reduces inside forward and backward) trained 3 steps under npugraph_ex
    equals the eager single-device block; the collectives ran eagerly between captured pieces, which replayed."""
    import npudist  # noqa: F401
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import torch.npu.npugraph_ex as npugraph_ex

    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    try:
        npugraph_ex.register()
        mesh = init_device_mesh("npu", (world,))
        base, cos, sin = _block()
        eager, model = copy.deepcopy(base).npu(), copy.deepcopy(base).npu()
        plan = {name: ColwiseParallel() for name in ("attention.wq", "attention.wk", "attention.wv",
                                                      "feed_forward.w1", "feed_forward.w3")}
        plan.update({"attention.wo": RowwiseParallel(), "feed_forward.w2": RowwiseParallel()})
        parallelize_module(model, mesh, plan)
        compiled = torch.compile(model, backend="npugraph_ex", fullgraph=True)
        data = [torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(i)).npu() for i in range(3)]
        got = _train(compiled, cos, sin, data, params=model.parameters())
        want = _train(eager, cos, sin, data)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            full = p.full_tensor() if isinstance(p, DTensor) else p
            torch.testing.assert_close(full, q.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
        stats = counters["npugraph_ex"]
        assert stats["eager_collective_pieces"] > 0 and stats["captured_pieces"] > stats["eager_collective_pieces"] / 2
        assert stats["replays"] > 0 and stats["captures"] > 0, dict(stats)
    finally:
        dist.destroy_process_group()


def _collectives(x):
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    a = fc.all_reduce(x * 2, "sum", group)
    g = fc.all_gather_tensor(a + 1, 0, group)
    r = fc.reduce_scatter_tensor(g.sin(), "sum", 0, group)
    t = fc.all_to_all_single(r * 3, None, None, group)
    b = fc.broadcast(t - 1, 0, group)
    return b.cos() + a.sum()


def collectives_worker(rank, world):
    """all_reduce, all_gather, reduce_scatter, all_to_all and broadcast inside one npugraph_ex graph: replayed
    calls with new inputs equal eager on every call."""
    import npudist  # noqa: F401
    from torch._dynamo.utils import counters

    import torch.npu.npugraph_ex as npugraph_ex

    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    try:
        npugraph_ex.register()
        compiled = torch.compile(_collectives, backend="npugraph_ex", fullgraph=True)
        for step in range(4):
            x = torch.randn(4, 3, generator=torch.Generator().manual_seed(10 * step + rank)).npu()
            torch.testing.assert_close(compiled(x).cpu(), _collectives(x).cpu(), rtol=1e-5, atol=1e-6)
        stats = counters["npugraph_ex"]
        assert stats["eager_collective_pieces"] >= 5 and stats["replays"] >= 3, dict(stats)
    finally:
        dist.destroy_process_group()


class _TPMlp(torch.nn.Module):
    """A row-split MLP: each rank holds half of the hidden units; the partial outputs are all-reduced."""

    def __init__(self, rank, world):
        super().__init__()
        torch.manual_seed(0)
        full_in, full_out = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8, bias=False)
        rows = slice(rank * 16 // world, (rank + 1) * 16 // world)
        self.up = torch.nn.Linear(8, 16 // world)
        self.down = torch.nn.Linear(16 // world, 8, bias=False)
        with torch.no_grad():
            self.up.weight.copy_(full_in.weight[rows])
            self.up.bias.copy_(full_in.bias[rows])
            self.down.weight.copy_(full_out.weight[:, rows])

    def forward(self, x):
        import torch.distributed._functional_collectives as fc

        return fc.all_reduce(self.down(torch.relu(self.up(x))), "sum", dist.group.WORLD) + 1


def cache_compile_worker(rank, world, cache_dir, out_dir, expect_load):
    """One process start of a 2-rank job using cache_compile: the first start saves, a later one loads without
    exporting or tracing; outputs are saved for the test to compare across starts."""
    import npudist  # noqa: F401
    from torch._dynamo.utils import counters

    import torch.npu.npugraph_ex.inference as inference

    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    try:
        model = _TPMlp(rank, world).npu()
        if expect_load:  # nothing may be traced on this start
            def refuse(*args, **kwargs):
                raise AssertionError("torch.export.export called on a start that should load the cache")
            torch.export.export = refuse
        compiled = inference.cache_compile(model.forward, cache_dir=cache_dir, tp_rank=rank)
        outs = []
        with torch.no_grad():
            for step, batch in enumerate((4, 4, 6)):
                x = torch.randn(batch, 8, generator=torch.Generator().manual_seed(step)).npu()
                got = compiled(x)
                torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)
                outs.append(got.cpu())
        stats = counters["npugraph_ex"]
        assert stats["cache_loads" if expect_load else "cache_saves"] == 1 and stats["eager_collective_pieces"] >= 1
        assert "cache_rebuilds" not in stats and ("cache_saves" not in stats) == expect_load, dict(stats)
        assert not counters["frames"], dict(counters["frames"])  # Dynamo traced no frame
        torch.save(outs, f"{out_dir}/rank{rank}_{'load' if expect_load else 'save'}.pt")
        assert "world2global_rank" in str(compiled.path) and f"tp_rank{rank}" in str(compiled.path)
    finally:
        dist.destroy_process_group()
