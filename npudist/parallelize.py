"""``parallelize(model, plan, mesh)``: apply a plan's parallelisms in torchtitan's order.

1. Pipeline split (``npudist.pp``) into this rank's stage modules;
2. in each stage: tensor parallelism (``npudist.tp``), then context parallelism (``npudist.cp``: sequence
   shards, attention across the cp ranks) and expert parallelism (``npudist.ep``: experts split over the ep
   ranks, left out of FSDP), then activation checkpointing and activation swap (``npudist.swap``: hooks on
   the blocks the plan's ``memory.swap`` names), then graph mode per block
   (``npudist.compile.apply``, when the plan's ``compile`` section enables it), then FSDP per block and
   the stage root (``npudist.fsdp``, over dp_shard x cp).

TP must precede FSDP so that FSDP shards the already tensor-parallel DTensors along the data-parallel mesh
dim (2-D parameters); AC must precede FSDP so FSDP's hooks surround the recomputed region; compile comes
after TP and AC (their collectives and recomputation are traced) and before FSDP (its hooks stay outside
the compiled blocks).

The model is known only through its spec (``npudist.models``, picked by ``plan.model.name``): block names
for the pipeline split, FSDP units and activation checkpointing, the head for loss parallelism, the
built-in TP plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from npudist.compile.apply import apply_compile, compile_loss
from npudist.cp import SequenceSharder, apply_cp
from npudist.ep import apply_ep, sync_expert_grads
from npudist.fsdp import apply_activation_checkpointing, apply_fsdp
from npudist.loss import cross_entropy_loss, loss_context
from npudist.mesh import get_cp_mesh, get_dp_mesh, get_ep_mesh, get_fsdp_mesh, get_pp_mesh, get_submesh, get_tp_mesh
from npudist.models import get_model_spec, model_layout
from npudist.plan.swap_rules import resolve_swap_blocks
from npudist.pp import build_pipeline
from npudist.swap.activations import apply_activation_swap
from npudist.tp import apply_tp


@dataclass
class ParallelModel:
    """This rank's share of a parallelized model."""
    parts: list[nn.Module]                 # one per local pipeline stage (one part without PP)
    device: torch.device
    mesh: DeviceMesh | None
    loss_fn: Callable
    loss_parallel: bool = False
    schedule: object = None                # a torch PipelineSchedule when pp_degree > 1
    stage_ids: list[int] = field(default_factory=lambda: [0])
    num_stages: int = 1
    pp_mesh: DeviceMesh | None = None
    compiled: list[str] = field(default_factory=list)   # blocks (and "loss") compiled per plan.compile
    expert_params: list = field(default_factory=list)   # experts split over ep (outside FSDP)
    edp_mesh: DeviceMesh | None = None                  # ranks holding the same experts
    sequence: SequenceSharder | None = None             # this rank's share of each sequence under cp
    activation_swaps: list = field(default_factory=list)  # npudist.swap.ActivationSwap per part that swaps

    def shard_batch(self, inputs: torch.Tensor, labels: torch.Tensor):
        """This rank's part of a micro-batch: the whole batch, or its sequence shard under context parallel."""
        if self.sequence is None:
            return inputs, labels
        return self.sequence.shard(inputs), self.sequence.shard(labels)

    def finish_grads(self) -> None:
        """Gradient reductions FSDP does not do, after the last backward of a step (expert replicas)."""
        sync_expert_grads(self.expert_params, self.edp_mesh)

    @property
    def pp_group(self):
        return self.pp_mesh.get_group() if self.pp_mesh is not None else None

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def parameters(self):
        seen = set()
        for part in self.parts:
            for p in part.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def named_parameters(self):
        """FQNs of the unsplit model (pipeline stages keep them)."""
        seen = set()
        for part in self.parts:
            for name, p in part.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield name, p

    def loss_context(self):
        return loss_context(self.loss_parallel)

    def train(self, mode: bool = True):
        for part in self.parts:
            part.train(mode)
        return self


def resolve_device(device_type: str) -> torch.device:
    if device_type == "cpu":
        return torch.device("cpu")
    mod = getattr(torch, device_type, None)
    if mod is None or not mod.is_available():
        raise ValueError(f"training.device={device_type!r} is not available in this process; "
                         "import npudist (which registers the npu device) or use device: cpu")
    return torch.device(device_type, mod.current_device())


def _builtin_tp(spec, layout):
    if spec.tp_plan is None or not callable(spec.tp_plan):
        return spec.tp_plan
    return lambda part, tp_cfg: spec.tp_plan(part, layout, tp_cfg)


def _retie(model: nn.Module, tied) -> None:
    """Re-share tied weights after ``.to(device)``. Module.to keeps shared parameters shared where it moves
    them in place (cpu, cuda, and npu, which registers the shallow-copy check: device/shallow_copy.py); on a
    device where it builds new Parameter objects instead, each use of a tied weight would get its own copy."""
    for owner, user in tied:
        model.get_submodule(user).weight = model.get_submodule(owner).weight


def parallelize(model: nn.Module, plan, mesh: DeviceMesh | None, loss_fn: Callable | None = None,
                n_microbatches: int | None = None) -> ParallelModel:
    """Parallelize ``model`` (already initialised, identically on every rank) per ``plan.parallel``.

    ``mesh`` comes from ``npudist.mesh.build_mesh`` (dims pp, dp_replicate, dp_shard, tp; size-1 dims
    absent) or is None for a single process. The model is moved to ``plan.training.device`` first.
    """
    par = plan.parallel
    spec = get_model_spec(plan.model.name)
    problems = spec.check(plan.model, par)
    if problems:
        raise ValueError(f"model {plan.model.name!r} cannot run this plan: " + "; ".join(problems))
    layout = model_layout(plan.model)
    device = resolve_device(plan.training.device)
    model = model.to(device)
    _retie(model, layout.tied)
    base_loss = loss_fn or cross_entropy_loss
    loss_fn = compile_loss(base_loss, plan.compile)
    tp_mesh = get_tp_mesh(mesh) if mesh is not None else None
    pp_mesh = get_pp_mesh(mesh) if mesh is not None else None
    # FSDP over dp_shard (HSDP with dp_replicate); replicate-only data parallelism uses FSDP2's replicate.
    dp_mesh = (get_fsdp_mesh(mesh) or get_dp_mesh(mesh)) if mesh is not None else None
    cp_mesh = get_cp_mesh(mesh) if mesh is not None else None
    ep_mesh = get_ep_mesh(mesh) if mesh is not None else None
    loss_par = tp_mesh is not None and par.tp.loss_parallel
    compiled: list[str] = []   # filled by parallelize_part, in stage order
    experts: list[nn.Parameter] = []
    sharder = SequenceSharder(cp_mesh, par.cp.load_balance) if cp_mesh is not None else None
    swap_blocks, _ = resolve_swap_blocks(plan.memory.swap.activations.blocks, list(layout.blocks))
    swaps: list = []

    def parallelize_part(part: nn.Module) -> nn.Module:
        if tp_mesh is not None:
            apply_tp(part, tp_mesh, par.tp, builtin=_builtin_tp(spec, layout), head=layout.head)
        if cp_mesh is not None:
            apply_cp(part, cp_mesh, par.cp, sharder)
        if ep_mesh is not None:
            experts.extend(apply_ep(part, ep_mesh, spec.expert_parallel))
        apply_activation_checkpointing(part, par.activation_checkpoint, list(layout.blocks))
        if swap_blocks:
            swap = apply_activation_swap(part, list(layout.blocks), swap_blocks)
            if swap is not None:
                swaps.append(swap)
        compiled.extend(apply_compile(part, plan.compile, list(layout.blocks)))
        if dp_mesh is not None:
            # Under PP each stage runs several micro-batch forwards per step: keep weights gathered.
            apply_fsdp(part, dp_mesh, par.fsdp, reshard_after_forward=False if pp_mesh is not None else None,
                       units=list(spec.fsdp_units), ignored=set(experts))
        return part

    loss_tag = ["loss"] if loss_fn is not base_loss else []
    extra = dict(expert_params=experts, edp_mesh=get_submesh(mesh, "edp") if ep_mesh is not None else None,
                 sequence=sharder, activation_swaps=swaps)
    if pp_mesh is None:
        parts = [parallelize_part(model)]
        return ParallelModel(parts=parts, device=device, mesh=mesh, loss_fn=loss_fn, loss_parallel=loss_par,
                             compiled=compiled + loss_tag, **extra)
    if n_microbatches is None:
        n_microbatches = par.pp.resolved_microbatches(pp_mesh.size())
    if not spec.supports_pipeline:
        raise ValueError(f"model {plan.model.name!r} cannot be pipelined (its spec has no stage split); set "
                         "parallel.pp_degree to 1 or register a ModelSpec with supports_pipeline=True")
    schedule, parts, stage_ids = build_pipeline(model, pp_mesh, par.pp, device, loss_fn, n_microbatches,
                                                blocks=list(layout.blocks), first=list(layout.first),
                                                last=list(layout.last), parallelize_stage=parallelize_part)
    return ParallelModel(parts=parts, device=device, mesh=mesh, loss_fn=loss_fn, loss_parallel=loss_par,
                         schedule=schedule, stage_ids=stage_ids,
                         num_stages=pp_mesh.size() * par.pp.virtual_stages, pp_mesh=pp_mesh,
                         compiled=compiled + loss_tag, **extra)
