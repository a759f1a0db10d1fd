"""AdamW and the warmup + decay learning-rate schedule."""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def build_optimizer(named_params, opt_cfg) -> torch.optim.AdamW:
    """AdamW per ``opt_cfg`` (an ``OptimizerConfig``). Weight decay applies to matrices only: decaying norm
    gains toward zero only hurts. ``foreach=False`` because tensor parallelism without sequence parallelism
    mixes DTensor and plain parameters, which the multi-tensor kernels cannot take in one group."""
    if opt_cfg.name != "adamw":
        raise ValueError(f"optimizer.name={opt_cfg.name!r} is not supported; use adamw")
    decay, no_decay = [], []
    for _, p in named_params:
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": opt_cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=opt_cfg.lr, betas=tuple(opt_cfg.betas),
                             eps=opt_cfg.eps, foreach=False)


def lr_factor(step: int, total_steps: int, sched_cfg) -> float:
    """Multiplier of the peak lr after ``step`` optimizer steps: linear warmup from 1/(warmup+1) to 1 over
    ``warmup_steps``, then ``decay`` to ``min_lr_ratio`` at ``total_steps``."""
    warmup = sched_cfg.warmup_steps
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if sched_cfg.decay == "constant":
        return 1.0
    span = max(total_steps - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    floor = sched_cfg.min_lr_ratio
    if sched_cfg.decay == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    if sched_cfg.decay == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"schedule.decay={sched_cfg.decay!r} is unknown; use cosine, linear or constant")


def build_lr_scheduler(optimizer, sched_cfg, total_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, sched_cfg))
