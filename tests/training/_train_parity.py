"""Parity harness: the same tiny model, data and seed trained single-device (plain PyTorch loop) and under a
parallel layout through npudist.parallelize + npudist.train.step."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from npudist.data import TextDataset
from npudist.models import build_model, get_model_spec, model_layout
from npudist.plan import (ACConfig, CPConfig, DataConfig, FSDPConfig, ModelConfig, OptimizerConfig, ParallelConfig,
                          Plan, PPConfig, ScheduleConfig, TPConfig, TrainingConfig)
from npudist.train.optim import build_lr_scheduler, build_optimizer

STEPS = 5
GLOBAL_BATCH = 8
MICRO_GLOBAL = 4   # sequences per micro-step summed over dp ranks -> 2 accumulation steps per optimizer step


def make_plan(corpus: str, device: str, dp_shard=1, dp_replicate=1, tp=1, pp=1, schedule="1F1B", virtual=1, tied=False,
              sequence_parallel=False, loss_parallel=False, ac="none", ac_policy="layer", microbatches=2,
              tp_plan=None, cpu_offload=False, model=None, wrap=None, cp=1, ep=1, cp_method="ring") -> Plan:
    """``model``: fields over the tiny default (e.g. another model spec, with that spec's config class)."""
    dp = dp_shard * dp_replicate
    model_fields = dict(vocab_size=256, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64,
                        max_seq_len=32, tie_embeddings=tied)
    model_fields.update(model or {})
    config_cls = get_model_spec(model_fields.get("name", "llama")).config_cls or ModelConfig
    return Plan(
        model=config_cls(**model_fields),
        data=DataConfig(path=corpus, seq_len=16, global_batch_size=GLOBAL_BATCH,
                        micro_batch_size=MICRO_GLOBAL // dp, seed=3),
        optimizer=OptimizerConfig(lr=2e-3, weight_decay=0.1),
        schedule=ScheduleConfig(warmup_steps=2, decay="cosine", min_lr_ratio=0.1),
        training=TrainingConfig(steps=STEPS, seed=7, max_grad_norm=0.5, device=device),
        parallel=ParallelConfig(dp_replicate_degree=dp_replicate, dp_shard_degree=dp_shard, tp_degree=tp,
                                pp_degree=pp, cp_degree=cp, ep_degree=ep, cp=CPConfig(method=cp_method),
                                fsdp=FSDPConfig(cpu_offload=cpu_offload, wrap=wrap),
                                tp=TPConfig(plan=tp_plan, sequence_parallel=sequence_parallel,
                                            loss_parallel=loss_parallel),
                                pp=PPConfig(schedule=schedule, microbatches=microbatches, virtual_stages=virtual),
                                activation_checkpoint=ACConfig(mode=ac, selective_policy=ac_policy)),
    )


def reference_run(plan: Plan) -> dict:
    """Single-device training with plain PyTorch (no npudist wrappers): losses, grad norms, final params."""
    torch.manual_seed(plan.training.seed)
    model = build_model(plan.model)
    opt = build_optimizer(model.named_parameters(), plan.optimizer)
    sched = build_lr_scheduler(opt, plan.schedule, plan.training.steps)
    ds = TextDataset(plan.data.path, plan.data.seq_len, MICRO_GLOBAL, seed=plan.data.seed)
    accum = GLOBAL_BATCH // MICRO_GLOBAL
    losses, norms = [], []
    for _ in range(plan.training.steps):
        opt.zero_grad()
        step_loss = 0.0
        for _ in range(accum):
            x, y = ds.next_batch()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            step_loss += loss.item() / accum
        for p in model.parameters():
            p.grad.div_(accum)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), plan.training.max_grad_norm)))
        opt.step()
        sched.step()
        losses.append(step_loss)
    return {"losses": losses, "norms": norms,
            "params": {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}}


def parallel_worker(rank: int, world: int, plan: Plan, out_path: str) -> None:
    import torch.distributed as dist

    device = plan.training.device
    if device == "npu":
        import npudist
        npudist.register()   # a no-op after `import torch` autoloaded it; needed with autoload off
        torch.npu.set_device(rank)
    dist.init_process_group(plan.training.resolved_backend, rank=rank, world_size=world)
    try:
        train_and_save(plan, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


def train_and_save(plan: Plan, out_file: str) -> None:
    """Train ``plan`` through npudist.parallelize + train_step in the initialized process group; save the
    losses, gradient norms and whole final parameters to ``out_file``."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from npudist.mesh import build_mesh, dim_rank, dim_size
    from npudist.parallelize import parallelize
    from npudist.train.step import train_step

    device = plan.training.device
    plan = copy.deepcopy(plan)
    mesh = build_mesh(plan.parallel, device_type=device)
    torch.manual_seed(plan.training.seed)
    pm = parallelize(build_model(plan.model), plan, mesh)
    opt = build_optimizer(list(pm.named_parameters()), plan.optimizer)
    sched = build_lr_scheduler(opt, plan.schedule, plan.training.steps)
    dp, dp_rank = dim_size(mesh, "dp"), dim_rank(mesh, "dp")
    ds = TextDataset(plan.data.path, plan.data.seq_len, plan.data.micro_batch_size, dp_rank=dp_rank,
                     dp_degree=dp, seed=plan.data.seed)
    accum = plan.data.grad_accum_steps(dp)
    losses, norms = [], []
    for _ in range(plan.training.steps):
        batches = [ds.next_batch() for _ in range(accum)]
        loss, norm = train_step(pm, opt, sched, batches, plan.training.max_grad_norm)
        losses.append(loss)
        norms.append(norm)
    params = {}
    for name, p in pm.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        params[name] = full.detach().cpu().clone()
    for owner, user in model_layout(plan.model).tied:   # named_parameters lists a tied weight once
        if f"{owner}.weight" in params:
            params[f"{user}.weight"] = params[f"{owner}.weight"]
    torch.save({"losses": losses, "norms": norms, "params": params}, out_file)
    dist.barrier()


def plan_yaml(plan: Plan) -> str:
    """``plan`` as the YAML text of a plan file (every field spelled out)."""
    import dataclasses

    import yaml
    return yaml.safe_dump(dataclasses.asdict(plan), sort_keys=False)
