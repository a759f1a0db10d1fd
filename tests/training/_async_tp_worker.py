"""Worker for test_async_tp: trains a plan through npudist.parallelize (the parity harness's train_and_save) under
torch.profiler, and records which npu operators the trace shows and how often."""
from __future__ import annotations

import collections
import json

import torch
import torch.distributed as dist

from _train_parity import train_and_save


def run(rank: int, world: int, plan, out_path: str) -> None:
    import npudist
    npudist.register()
    torch.npu.set_device(rank)
    dist.init_process_group("hccl", rank=rank, world_size=world)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            train_and_save(plan, f"{out_path}.{rank}")
        counts = collections.Counter(e.name for e in prof.events() if e.name.startswith("npu::"))
        with open(f"{out_path}.{rank}.ops.json", "w") as f:
            json.dump(counts, f)
    finally:
        dist.destroy_process_group()
