"""Gradient clipping by the global norm, correct for every layout.

The global norm is the norm of the gradient of the *whole* model, whatever holds it:
* DTensor gradients (FSDP shards, TP shards, both): DTensor's own norm reduction gives the norm over the
  mesh; tensors with the same mesh and placements are reduced together (one collective per group).
* plain gradients under TP are replicated over the tp ranks, so they count once, locally.
* pipeline stages hold disjoint parameters: the squared norms are summed over the pp group.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _group_norms(grads: list[torch.Tensor], norm_type: float) -> list[torch.Tensor]:
    groups: dict[object, list[torch.Tensor]] = defaultdict(list)
    for g in grads:
        key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else ("local", g.device, g.dtype)
        groups[key].append(g)
    norms = []
    for members in groups.values():
        per = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float32) for g in members]
        total = torch.linalg.vector_norm(torch.stack(per), norm_type)
        if isinstance(total, DTensor):
            total = total.full_tensor()
        norms.append(total)
    return norms


def global_grad_norm(parameters, norm_type: float = 2.0, pp_group=None) -> torch.Tensor:
    """Norm of all gradients of the model (fp32 scalar tensor, the same on every rank)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    norms = _group_norms(grads, norm_type)
    if math.isinf(norm_type):
        total = torch.stack(norms).max()
        if pp_group is not None:
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=pp_group)
        return total
    total = torch.stack(norms).pow(norm_type).sum()
    if pp_group is not None:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_group)
    return total.pow(1.0 / norm_type)


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, pp_group=None) -> torch.Tensor:
    """Scale gradients in place so their global norm is at most ``max_norm``; returns the norm before
    clipping. Same formula as ``torch.nn.utils.clip_grad_norm_`` so single-device runs agree with it."""
    parameters = list(parameters)
    total = global_grad_norm(parameters, norm_type, pp_group)
    coef = min(float(max_norm) / (float(total) + 1e-6), 1.0)
    if coef < 1.0:
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(coef)
    return total
