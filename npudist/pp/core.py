"""Pipeline parallelism over ``torch.distributed.pipelining``: split the model into stages, build a schedule.

Splitting is by deep copy + pruning (as torchtitan does): every stage starts as the whole model and keeps
only its own blocks plus, on the first stage, the modules only the first stage runs (the embedding) and,
on the last, those only the last runs (final norm, head). Which modules those are comes from the caller
(the model spec's layout: ``blocks``, ``first``, ``last`` as module names), so this module names no model
attribute. The model's ``forward`` must skip a module set to None, and its blocks must live in a
``ModuleDict`` (deleting from a ``ModuleList`` would renumber them). Parameter names therefore match the
unsplit model, which is what checkpoints and the parity tests compare by.

Stage block ranges and stage placement come from ``npudist.plan.ranks`` (shared with ``npudist plan check``):
looped schedules give pp rank ``r`` stages ``r, r + pp, ...``; the V-shaped ZBVZeroBubble gives rank ``r``
stages ``r`` and ``2 pp - 1 - r``.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (PipelineScheduleMulti, PipelineScheduleSingle,
                                                    Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                                    ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)

from npudist.plan.ranks import stage_layer_ranges, stages_of_rank

SCHEDULES = {
    "GPipe": ScheduleGPipe,
    "1F1B": Schedule1F1B,
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "InterleavedZeroBubble": ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": ScheduleZBVZeroBubble,
}


def _remove(model: nn.Module, fqn: str, delete: bool) -> None:
    parent, _, child = fqn.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    if delete:
        delattr(owner, child)
    else:
        setattr(owner, child, None)


def split_stage(model: nn.Module, stage_id: int, num_stages: int, layers: range, blocks: list[str],
                first: list[str], last: list[str]) -> nn.Module:
    """A copy of ``model`` that keeps only what stage ``stage_id`` runs: the blocks (module names) at the
    indices ``layers``, the ``first`` modules on stage 0 and the ``last`` modules on the final stage."""
    shared = _shared_across(model, first, last)
    if shared and num_stages > 1:
        raise ValueError(f"{shared[0]} and {shared[1]} share a weight but sit on different pipeline stages; "
                         "untie them (model.tie_embeddings: false) or set parallel.pp_degree to 1")
    stage = copy.deepcopy(model)
    for i, fqn in enumerate(blocks):
        if i not in layers:
            _remove(stage, fqn, delete=True)
    if stage_id != 0:
        for fqn in first:
            _remove(stage, fqn, delete=False)
    if stage_id != num_stages - 1:
        for fqn in last:
            _remove(stage, fqn, delete=False)
    return stage


def _shared_across(model: nn.Module, first: list[str], last: list[str]) -> tuple[str, str] | None:
    """A (first-stage module, last-stage module) pair holding the same parameter, if any."""
    owners = {id(p): f for f in first for p in model.get_submodule(f).parameters()}
    for name in last:
        for p in model.get_submodule(name).parameters():
            if id(p) in owners:
                return owners[id(p)], name
    return None


def build_pipeline(model: nn.Module, pp_mesh: DeviceMesh, pp_cfg, device: torch.device,
                   loss_fn: Callable, n_microbatches: int, blocks: list[str], first: list[str] = (),
                   last: list[str] = (), parallelize_stage: Callable[[nn.Module], nn.Module] | None = None):
    """Split ``model`` over ``pp_mesh`` per ``pp_cfg`` (a ``PPConfig``) and build its schedule.
    ``blocks``, ``first``, ``last``: module names as in ``split_stage``.

    ``parallelize_stage`` is applied to each stage module before it is wrapped (TP, AC, FSDP), which is
    the torchtitan order: PP split first, then the other parallelisms inside each stage.
    Returns ``(schedule, stage_modules, stage_ids)``; ``stage_modules`` are this rank's model parts. The
    losses the schedule reports are divided by ``n_microbatches``: their sum is the micro-step's mean loss.
    """
    pp_degree, pp_rank = pp_mesh.size(), pp_mesh.get_local_rank()
    if pp_cfg.schedule not in SCHEDULES:
        raise ValueError(f"parallel.pp.schedule={pp_cfg.schedule!r} is unknown; choose one of "
                         f"{', '.join(SCHEDULES)}")
    schedule_cls = SCHEDULES[pp_cfg.schedule]
    multi = issubclass(schedule_cls, PipelineScheduleMulti)
    if not multi and pp_cfg.virtual_stages != 1:
        raise ValueError(f"parallel.pp.schedule={pp_cfg.schedule} runs one stage per rank; set "
                         "parallel.pp.virtual_stages: 1 or use Interleaved1F1B / ZBVZeroBubble")
    num_stages = pp_degree * pp_cfg.virtual_stages
    bounds = stage_layer_ranges(len(blocks), num_stages, pp_cfg.split_points)
    stage_ids = stages_of_rank(pp_rank, pp_degree, pp_cfg.virtual_stages, pp_cfg.schedule)
    group = pp_mesh.get_group()
    modules, stages = [], []
    for sid in stage_ids:
        part = split_stage(model, sid, num_stages, bounds[sid], list(blocks), list(first), list(last))
        if parallelize_stage is not None:
            part = parallelize_stage(part)
        modules.append(part)
        stages.append(PipelineStage(part, sid, num_stages, device, group=group))
    # The schedule's own scale_grads divides *all* accumulated .grad by n_microbatches at the end of each
    # step(), which would shrink gradients kept from an earlier gradient-accumulation micro-step again.
    # Scaling each micro-batch loss instead is exact and leaves accumulation to autograd.
    def scaled_loss(output, target):
        return loss_fn(output, target) / n_microbatches

    if multi:
        schedule = schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=scaled_loss, scale_grads=False)
    else:
        assert issubclass(schedule_cls, PipelineScheduleSingle)
        schedule = schedule_cls(stages[0], n_microbatches=n_microbatches, loss_fn=scaled_loss,
                                scale_grads=False)
    return schedule, modules, stage_ids
