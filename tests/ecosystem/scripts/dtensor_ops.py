"""Worker: npu operators on DTensors over a 2-rank npu mesh (hccl): sharded forward and backward equal the
same operators on the full tensors."""
import json
import sys

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401  (registers the operators' DTensor rules)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

dist.init_process_group("hccl")
rank = dist.get_rank()
mesh = init_device_mesh("npu", (2,))
torch.manual_seed(0)
x, gamma = torch.randn(4, 6, 16), torch.randn(16)
cos, sin = torch.randn(1, 6, 1, 16), torch.randn(1, 6, 1, 16)
dev = torch.device("npu", torch.npu.current_device())


def model(x, gamma, cos, sin):
    h = torch.ops.npu.npu_rms_norm(x, gamma, 1e-6)[0]
    h = torch.ops.npu.npu_rotary_mul(h.unsqueeze(2), cos, sin).squeeze(2)
    return torch.ops.npu.npu_swiglu(h, dim=-1)


# reference: full tensors on this rank's npu
xr, gr = x.to(dev).requires_grad_(True), gamma.to(dev).requires_grad_(True)
ref = model(xr, gr, cos.to(dev), sin.to(dev))
ref.pow(2).sum().backward()

xd = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_(True)
gd = distribute_tensor(gamma, mesh, [Replicate()]).requires_grad_(True)
cd, sd = (distribute_tensor(t, mesh, [Replicate()]) for t in (cos, sin))
out = model(xd, gd, cd, sd)
out.pow(2).sum().backward()


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


err = {"out": rel(out.full_tensor(), ref), "dx": rel(xd.grad.full_tensor(), xr.grad),
       "dgamma": rel(gd.grad.full_tensor(), gr.grad)}
info = {"rank": rank, "out_placements": str(out.placements), "dgamma_placements": str(gd.grad.placements),
        "err": err}
sys.stdout.write("REPORT " + json.dumps(info) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
