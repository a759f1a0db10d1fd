"""Expert parallelism (EP) for the MoE layers of a model (``npudist.models.moe``), as torchtitan does it.

``apply_ep`` shards every ``GroupedExperts`` weight on its expert dim over the ep mesh (a DTensor
``Shard(0)``, so checkpoints hold whole tensors and reshard to any ep degree) and gives each MoE layer an
``AllToAllDispatch``: the routing slots, sorted by expert, go to the rank holding that expert with one
``all_to_all_single`` (uneven splits, autograd: the backward is the reverse all-to-all), come back the
same way after the experts ran, and are combined where they came from.

Gradients: expert weights are left out of FSDP. Every rank of an ep group sends tokens to the same expert
shard, so the shard's gradient is a sum over the ep ranks of per-rank mean losses; ``GroupedExperts.grad_scale``
= 1/ep turns it into their mean, as FSDP's reduce-scatter does for the other weights. Ranks holding the
same experts (the ``edp`` group: dp_replicate x dp_shard x cp / ep) average their expert gradients with
``sync_expert_grads`` after backward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard


class AllToAllDispatch:
    """Token dispatch and combine over an ep process group of ``size`` ranks, each holding
    ``n_experts / size`` consecutive experts."""

    def __init__(self, group, n_experts: int):
        self.group = group
        self.size = dist.get_world_size(group)
        self.local_experts = n_experts // self.size

    def dispatch(self, x: torch.Tensor, counts: torch.Tensor):
        """x: routing slots sorted by expert, ``counts[e]`` of them for expert e (all experts). Returns this
        rank's slots grouped by local expert, their counts, and what ``combine`` needs."""
        # counts[e] of every source rank, laid out [source, local expert].
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts, group=self.group)
        send_splits = counts.view(self.size, self.local_experts).sum(1).tolist()
        by_source = recv.view(self.size, self.local_experts)
        recv_splits = by_source.sum(1).tolist()
        received = funcol.all_to_all_single_autograd(x.contiguous(), recv_splits, send_splits, self.group)
        # Received rows are ordered (source, expert); the experts want them (expert, source).
        sizes = by_source.flatten().tolist()
        starts = [0]
        for n in sizes[:-1]:
            starts.append(starts[-1] + n)
        order = [torch.arange(starts[s * self.local_experts + e], starts[s * self.local_experts + e]
                              + sizes[s * self.local_experts + e]) for e in range(self.local_experts)
                 for s in range(self.size)]
        order = torch.cat(order).to(x.device) if order else torch.zeros(0, dtype=torch.long, device=x.device)
        return received[order], by_source.sum(0).tolist(), (order, send_splits, recv_splits)

    def combine(self, y: torch.Tensor, ctx) -> torch.Tensor:
        order, send_splits, recv_splits = ctx
        received = torch.empty_like(y).index_copy(0, order, y)   # back to (source, expert) order
        return funcol.all_to_all_single_autograd(received, send_splits, recv_splits, self.group)


def shard_expert_weights(experts: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Replace every grouped weight ``[n_experts, ...]`` of ``experts`` by a DTensor ``Shard(0)`` over the ep
    mesh holding this rank's consecutive experts."""
    rank, size = ep_mesh.get_local_rank(), ep_mesh.size()
    for name, param in list(experts.named_parameters(recurse=False)):
        per = param.shape[0] // size
        local = param.detach()[rank * per:(rank + 1) * per].clone()
        dt = DTensor.from_local(local, ep_mesh, [Shard(0)], run_check=False)
        setattr(experts, name, nn.Parameter(dt, requires_grad=param.requires_grad))


def apply_ep(model: nn.Module, ep_mesh: DeviceMesh, expert_modules=None) -> list[nn.Parameter]:
    """Split the experts of every MoE layer of ``model`` over the 1-D ``ep_mesh``; returns the expert
    parameters (which FSDP must leave alone). ``expert_modules``: the model spec's ``expert_parallel`` hook
    for a model whose experts are not ``npudist.models.moe`` layers (its modules get ``npudist_dispatch``
    and ``npudist_grad_scale``)."""
    if expert_modules is not None:
        return _split_expert_modules(expert_modules(model), ep_mesh)
    from npudist.models.moe import moe_layers
    group, size = ep_mesh.get_group(), ep_mesh.size()
    params: list[nn.Parameter] = []
    for _, moe in moe_layers(model):
        if moe.n_experts % size:
            raise ValueError(f"parallel.ep_degree: {moe.n_experts} experts cannot be split over {size} ep ranks")
        shard_expert_weights(moe.experts, ep_mesh)
        moe.experts.grad_scale = 1.0 / size
        moe.dispatcher = AllToAllDispatch(group, moe.n_experts)
        params.extend(moe.experts.parameters())
    return params


def _split_expert_modules(found, ep_mesh: DeviceMesh) -> list[nn.Parameter]:
    group, size = ep_mesh.get_group(), ep_mesh.size()
    params: list[nn.Parameter] = []
    for name, experts in found:
        n = next(experts.parameters(recurse=False)).shape[0]
        if n % size:
            raise ValueError(f"parallel.ep_degree: the {n} experts of {name} cannot be split over {size} ep ranks")
        shard_expert_weights(experts, ep_mesh)
        experts.npudist_dispatch = AllToAllDispatch(group, n)
        # Each ep rank's loss is a mean over its own tokens: the factor turns the sum over the ep ranks that
        # fed this shard into their mean (as GroupedExperts.grad_scale does).
        experts.npudist_grad_scale = 1.0 / size
        params.extend(experts.parameters(recurse=False))
    return params


def sync_expert_grads(params: list[nn.Parameter], edp_mesh: DeviceMesh | None) -> None:
    """Average the expert gradients over the ranks holding the same experts (after backward)."""
    if edp_mesh is None:
        return
    group = edp_mesh.get_group()
    for p in params:
        if p.grad is not None:
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(grad, op=dist.ReduceOp.AVG, group=group)
