"""A training script written for CUDA (nccl, .cuda(), device="cuda", torch.cuda.*, torch.cuda.amp), run
unchanged on npu through transfer_to_npu. Reports devices/backend and the step's error against a cpu
reference of the same data-parallel step."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_npu.contrib import transfer_to_npu  # noqa: F401  (the only line added to the CUDA script)

# ---- the CUDA script, unchanged ----
assert torch.cuda.is_available()
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
init = {k: v.clone() for k, v in model.state_dict().items()}
model = model.cuda()
ddp = DDP(model, device_ids=[local_rank])
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
scaler = torch.cuda.amp.GradScaler(init_scale=2.0 ** 4)
gen = torch.Generator().manual_seed(100 + rank)
x = torch.randn(6, 8, generator=gen).to(device)
y = torch.randint(0, 4, (6,), generator=gen).cuda()
with torch.cuda.amp.autocast(dtype=torch.bfloat16):
    loss = torch.nn.functional.cross_entropy(ddp(x).float(), y)
scaler.scale(loss).backward()
scaler.step(opt)
scaler.update()
torch.cuda.synchronize()
mem = torch.cuda.memory_allocated()
# ---- end of the CUDA script ----

# Reference on cpu: the same bf16-autocast forward, gradients averaged over both ranks' batches.
ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
ref.load_state_dict(init)
total = 0
for r in range(world):
    g = torch.Generator().manual_seed(100 + r)
    xr, yr = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        total = total + torch.nn.functional.cross_entropy(ref(xr).float(), yr)
(total / world).backward()
with torch.no_grad():
    for p in ref.parameters():
        p -= 0.05 * p.grad
err = max((a.detach().cpu() - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))
info = {"rank": rank, "param_device": str(next(model.parameters()).device), "x_device": str(x.device),
        "backend": dist.get_backend(), "mem": mem, "max_err": err}
sys.stdout.write("REPORT " + json.dumps(info) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
