"""Pipeline parallelism over ``torch.distributed.pipelining``: split the model into stages, build a schedule.

Splitting is by deep copy + pruning (as torchtitan does): every stage starts as the whole model and keeps
only its own blocks (``layers`` is a ModuleDict keyed by the global index) plus, on the first stage, the
embedding and, on the last, the final norm and output head. Parameter names therefore match the
unsplit model, which is what checkpoints and the parity tests compare by.

Stage layer ranges and stage placement come from ``npudist.mesh.layout`` (shared with ``npudist plan check``):
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

from npudist.mesh.layout import stage_layer_ranges, stages_of_rank
from torch.distributed.pipelining.schedules import (PipelineScheduleMulti, PipelineScheduleSingle,
                                                    Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                                    ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)

SCHEDULES = {
    "GPipe": ScheduleGPipe,
    "1F1B": Schedule1F1B,
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "InterleavedZeroBubble": ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": ScheduleZBVZeroBubble,
}


def split_stage(model: nn.Module, stage_id: int, num_stages: int, layers: range) -> nn.Module:
    """A copy of ``model`` that keeps only what stage ``stage_id`` runs."""
    if model.args.tie_embeddings and num_stages > 1:
        raise ValueError("model.tie_embeddings: true cannot be pipelined (embedding and output head sit on "
                         "different stages); set it to false or parallel.pp_degree to 1")
    stage = copy.deepcopy(model)
    for name in list(stage.layers):
        if int(name) not in layers:
            del stage.layers[name]
    if stage_id != 0:
        stage.tok_embeddings = None
    if stage_id != num_stages - 1:
        stage.norm = None
        stage.output = None
    return stage


def build_pipeline(model: nn.Module, pp_mesh: DeviceMesh, pp_cfg, device: torch.device,
                   loss_fn: Callable, n_microbatches: int,
                   parallelize_stage: Callable[[nn.Module], nn.Module] | None = None):
    """Split ``model`` over ``pp_mesh`` per ``pp_cfg`` (a ``PPConfig``) and build its schedule.

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
    bounds = stage_layer_ranges(model.args.n_layers, num_stages, pp_cfg.split_points)
    stage_ids = stages_of_rank(pp_rank, pp_degree, pp_cfg.virtual_stages, pp_cfg.schedule)
    group = pp_mesh.get_group()
    modules, stages = [], []
    for sid in stage_ids:
        part = split_stage(model, sid, num_stages, bounds[sid])
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
