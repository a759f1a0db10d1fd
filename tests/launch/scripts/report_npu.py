"""Worker for npu launcher tests: device binding as the script sees it, then an all_reduce over hccl."""
import json
import sys
import os

import torch
import torch.distributed as dist

bound = torch.npu.current_device()  # before any npudist/distributed call in this script
dist.init_process_group("hccl")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((1000,), float(rank + 1), device="npu")
dist.all_reduce(t)
hccl = dist.group.WORLD._get_backend(torch.device("npu"))
info = {
    "rank": rank, "world": world, "local_rank": int(os.environ["LOCAL_RANK"]), "bound": bound,
    "device_count": torch.npu.device_count(), "tensor_device": str(t.device),
    "sum_min": t.min().item(), "sum_max": t.max().item(), "backend": dist.get_backend(),
    "num_nodes": hccl.num_nodes, "node_index": hccl.node_index, "uses_gloo": hccl.uses_gloo,
    "buffer_mb": hccl.buffer_bytes >> 20, "node_id": os.environ.get("NPUDIST_NODE_ID"),
}
# One write() per line: with PYTHONUNBUFFERED=1, print() writes text and newline separately, and under
# `--tee 0` both ranks share one stdout, so their lines could interleave mid-line.
sys.stdout.write("REPORT " + json.dumps(info) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
