"""One optimizer step of a ``ParallelModel``: forward/backward over the accumulation micro-steps (through the
pipeline schedule under PP), gradient averaging, global-norm clipping, optimizer and LR step.

The returned loss is the global mean over every token of the step: pipeline losses exist only on the last
stage, tensor-parallel ranks hold identical copies and context-parallel ranks means over equal shares of the
same sequences, so one world all-reduce of (loss on last-stage ranks, 0 elsewhere) divided by dp x cp x tp
(= world / pp) gives it on every rank.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from npudist.train.grad import clip_grad_norm_, global_grad_norm


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training cannot continue meaningfully."""


def forward_backward(pm, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
    """Run one micro-step; returns this rank's detached mean loss, or None on a non-last pipeline rank."""
    inputs, labels = pm.shard_batch(inputs, labels)
    inputs = inputs.to(pm.device, non_blocking=True)
    labels = labels.to(pm.device, non_blocking=True)
    with pm.loss_context():
        if pm.schedule is not None:
            losses: list[torch.Tensor] | None = [] if pm.has_last_stage else None
            target = labels if pm.has_last_stage else None
            if pm.has_first_stage:
                pm.schedule.step(inputs, target=target, losses=losses)
            else:
                pm.schedule.step(target=target, losses=losses)
            if not pm.has_last_stage:
                return None
            # Each micro-batch loss was divided by the micro-batch count (see build_pipeline): sum = mean.
            loss = torch.stack([_local(x) for x in losses]).sum()
        else:
            loss = pm.loss_fn(pm.parts[0](inputs), labels)
            loss.backward()
            loss = _local(loss)
    return loss.detach()


def _local(loss: torch.Tensor) -> torch.Tensor:
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def reduce_loss(pm, local_loss: torch.Tensor | None) -> float:
    """Global mean loss (see module docstring); a plain float, identical on every rank."""
    value = local_loss.float() if local_loss is not None else torch.zeros((), device=pm.device)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return float(value)
    value = value.to(pm.device).clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    pp = pm.pp_mesh.size() if pm.pp_mesh is not None else 1
    return float(value) / (dist.get_world_size() // pp)


def train_step(pm, optimizer, lr_scheduler, micro_batches, max_grad_norm: float | None):
    """Accumulate gradients over ``micro_batches`` (list of (inputs, labels)), clip, step.

    Returns ``(loss, grad_norm)`` as floats. Gradients are averaged over micro-steps by dividing once after
    accumulation, which works identically for plain, DTensor and pipeline-scheduled backward passes.
    Raises ``NonFiniteLossError`` (on every rank at once, since loss and norm are global) if the loss or the
    gradient norm is not finite; the optimizer is not stepped in that case.
    """
    optimizer.zero_grad(set_to_none=True)
    local = [forward_backward(pm, x, y) for x, y in micro_batches]
    pm.finish_grads()
    accum = len(micro_batches)
    local_mean = torch.stack(local).mean() if local[0] is not None else None
    loss = reduce_loss(pm, local_mean)
    if not math.isfinite(loss):
        raise NonFiniteLossError(f"loss is {loss}")
    if accum > 1:
        with torch.no_grad():
            for p in pm.parameters():
                if p.grad is not None:
                    p.grad.div_(accum)
    params = list(pm.parameters())
    if max_grad_norm is not None:
        grad_norm = float(clip_grad_norm_(params, max_grad_norm, pp_group=pm.pp_group))
    else:
        grad_norm = float(global_grad_norm(params, pp_group=pm.pp_group))
    if not math.isfinite(grad_norm):
        # The parameters are already inf/nan or about to be: stepping would only spread it.
        raise NonFiniteLossError(f"gradient norm is {grad_norm} (loss {loss})")
    optimizer.step()
    if lr_scheduler is not None:
        lr_scheduler.step()
    return loss, grad_norm
