"""Worker for a multi-node failure: the last rank dies after one all_reduce, the others then need it."""
import time

import torch
import torch.distributed as dist

dist.init_process_group("hccl")
t = torch.ones(4, device="npu")
dist.all_reduce(t)
if dist.get_rank() == dist.get_world_size() - 1:
    raise RuntimeError(f"rank {dist.get_rank()} dies after the first all_reduce")
time.sleep(1)
dist.all_reduce(t)  # a peer on the other node is gone: this must fail, not hang
print("UNEXPECTED all_reduce completed", flush=True)
