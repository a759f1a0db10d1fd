"""Worker: npu operators on DTensors over a 2-rank npu mesh (hccl): MoE permute/unpermute with tokens sharded on
the hidden dim, norms and activations batch-sharded; forward and backward equal the full tensors."""
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


def norm_act(x, x2, g):
    y, _, res = torch.ops.npu.npu_add_rms_norm(x, x2, g, 1e-6)
    y = torch.ops.npu.npu_gemma_rms_norm(y, g)[0] + torch.ops.npu.npu_layer_norm_eval(res.detach(), [h], g.detach(), g.detach())
    y = torch.ops.npu.npu_gelu_mul(torch.ops.npu.npu_fast_gelu(y)) + torch.ops.npu.npu_silu(y[..., : h // 2])
    return torch.ops.npu.npu_mish(y)


# norms and activations on a batch-sharded (Shard(0)) activation with a replicated weight
x, x2, g = torch.randn(4, 3, h), torch.randn(4, 3, h), torch.randn(h)
xr, x2r, gr = (t.to(dev).requires_grad_(True) for t in (x, x2, g))
ref = norm_act(xr, x2r, gr)
ref.pow(2).sum().backward()
xd, x2d = (distribute_tensor(t, mesh, [Shard(0)]).requires_grad_(True) for t in (x, x2))
gd = distribute_tensor(g, mesh, [Replicate()]).requires_grad_(True)
out = norm_act(xd, x2d, gd)
out.pow(2).sum().backward()
placements["norm_act"] = str(out.placements).replace("dim=0", "dim=1")  # same check as the hidden-sharded ones
err["norm_act"] = {"out": rel(out.full_tensor(), ref), "dx": rel(xd.grad.full_tensor(), xr.grad),
                   "dx2": rel(x2d.grad.full_tensor(), x2r.grad), "dgamma": rel(gd.grad.full_tensor(), gr.grad)}

# aten.matmul (reaches DTensor under inference mode) and aten.matmul_backward, with the weight column- and
# row-parallel and the activation batch-sharded
from torch.distributed.tensor._api import DTensor  # noqa: E402

funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
x, w, dy = torch.randn(4, 3, 8), torch.randn(8, 6), torch.randn(4, 3, 6)
ref_out = x @ w
ref_dx, ref_dw = dy @ w.t(), (x.reshape(-1, 8).t() @ dy.reshape(-1, 6))
mm = {"registered": [str(op) for op in (torch.ops.aten.matmul.default, torch.ops.aten.matmul_backward.default)
                     if op in funcs]}
for name, px, pw, pdy in (("column", Replicate(), Shard(1), Shard(2)), ("row", Shard(2), Shard(0), Replicate()),
                          ("batch", Shard(0), Replicate(), Shard(0))):
    xd, wd, dyd = (distribute_tensor(t, mesh, [p]) for t, p in ((x, px), (w, pw), (dy, pdy)))
    with torch.inference_mode():
        out = torch.matmul(xd, wd)
    dx, dw = torch.ops.aten.matmul_backward(dyd, xd, wd, [True, True])
    mm[name] = {"placements": [str(t.placements) for t in (out, dx, dw)],
                "err": [rel(out.full_tensor().cpu(), ref_out), rel(dx.full_tensor().cpu(), ref_dx),
                        rel(dw.full_tensor().cpu(), ref_dw)]}
sys.stdout.write("MATMUL " + json.dumps(mm) + "\n")
sys.stdout.write("REPORT " + json.dumps({"rank": rank, "placements": placements, "err": err}) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
