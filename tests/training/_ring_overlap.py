"""One rank of the ring-attention overlap test (spawned by test_ring_attention.py)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

RANGES = ("ring_attention.exchange", "ring_attention.wait")
KERNELS = {"aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
           "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention_backward"}


def ring_worker(rank: int, world: int, device: str, out_path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from npudist.cp import SequenceSharder
    from npudist.cp.core import ContextParallelAttention

    if device == "npu":
        torch.npu.set_device(rank)
    dist.init_process_group("hccl" if device == "npu" else "gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh(device, (world,), mesh_dim_names=("cp",))
        sharder = SequenceSharder(mesh, load_balance=True)
        cp = ContextParallelAttention(sharder, "ring")
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.float64).float() for _ in range(3))
        g = torch.randn(2, 4, 16, 8)
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        F.scaled_dot_product_attention(*full, is_causal=True).backward(g)

        local = [sharder.shard(t, dim=2).to(device).requires_grad_() for t in (q, k, v)]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = cp.attention(*local)
            out.backward(sharder.shard(g, dim=2).to(device))
        events = sorted((e for e in prof.events() if e.name in RANGES or e.name in KERNELS),
                        key=lambda e: e.time_range.start)
        order = [KERNELS.get(e.name, e.name) for e in events]
        want_out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        errors = {"out": (out.detach().cpu() - sharder.shard(want_out, dim=2)).abs().max().item()}
        for name, t, ref in zip("qkv", local, full):
            errors["d" + name] = (t.grad.cpu() - sharder.shard(ref.grad, dim=2)).abs().max().item()
        torch.save({"order": order, "errors": errors}, f"{out_path}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
