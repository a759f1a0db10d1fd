"""Worker: the MoE token permute/unpermute operators on DTensors over a 2-rank npu mesh (hccl). Tokens sharded on
the hidden dim; forward and backward equal the same operators on the full tensors."""
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
dev = torch.device("npu", torch.npu.current_device())
torch.manual_seed(0)
n, h, e, topk = 6, 8, 4, 2
tokens, probs = torch.randn(n, h), torch.rand(n, topk)
indices = torch.stack([torch.randperm(e)[:topk] for _ in range(n)])
routing_map = torch.zeros(n, e, dtype=torch.bool).scatter_(1, indices, True)
map_probs = torch.rand(n, e) * routing_map


def index_form(t, p, idx):
    permuted, si = torch.ops.npu.npu_moe_token_permute(t, idx)
    return torch.ops.npu.npu_moe_token_unpermute(permuted * 2, si, p)


def map_form(t, p, rm):
    permuted, _, si = torch.ops.npu.npu_moe_token_permute_with_routing_map(t, rm, num_out_tokens=n * topk)
    return torch.ops.npu.npu_moe_token_unpermute_with_routing_map(permuted.sin(), si, [n, h], probs=p,
                                                                  routing_map=rm)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


err, placements = {}, {}
for name, fn, p, aux in (("index", index_form, probs, indices), ("map", map_form, map_probs, routing_map)):
    tr, pr = tokens.to(dev).requires_grad_(True), p.to(dev).requires_grad_(True)
    ref = fn(tr, pr, aux.to(dev))
    ref.pow(2).sum().backward()
    td = distribute_tensor(tokens, mesh, [Shard(1)]).requires_grad_(True)
    pd = distribute_tensor(p, mesh, [Replicate()]).requires_grad_(True)
    out = fn(td, pd, distribute_tensor(aux, mesh, [Replicate()]))
    out.pow(2).sum().backward()
    placements[name] = str(out.placements)
    err[name] = {"out": rel(out.full_tensor(), ref), "dtokens": rel(td.grad.full_tensor(), tr.grad),
                 "dprobs": rel(pd.grad.full_tensor(), pr.grad)}
sys.stdout.write("REPORT " + json.dumps({"rank": rank, "placements": placements, "err": err}) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
