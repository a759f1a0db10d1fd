"""Worker of the context/expert-parallel reshard test: in one 4-rank process group, train uninterrupted under
a source and a destination layout (saving at step 2), then resume each source layout's step-2 save under its
destination layout. Rank 0 writes the losses as JSON."""
from __future__ import annotations

import os

from _resume_layouts import SAVED_STEP, STEPS, copy_save, run_resumes
from npudist.models import MoEConfig
from npudist.plan import (CheckpointConfig, CPConfig, DataConfig, LoggingConfig, ModelConfig, OptimizerConfig,
                          ParallelConfig, Plan, ScheduleConfig, TrainingConfig)

MOE = dict(n_experts=4, top_k=2, moe_hidden_dim=32, n_dense_layers=1)
# name -> (model is moe, parallel degrees)
LAYOUTS = {
    "ep2_fsdp2": (True, dict(dp_shard_degree=4, ep_degree=2)),
    "ep1_fsdp4": (True, dict(dp_shard_degree=4)),
    "cp2_fsdp2": (False, dict(dp_shard_degree=2, cp_degree=2)),
    "cp1_fsdp4": (False, dict(dp_shard_degree=4)),
}
RESUMES = [("ep2_fsdp2", "ep1_fsdp4"), ("cp2_fsdp2", "cp1_fsdp4")]


def make_plan(corpus: str, device: str, layout: str, folder: str, load_step: int) -> Plan:
    moe, par = LAYOUTS[layout]
    fields = dict(vocab_size=256, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)
    model = MoEConfig(**fields, **MOE) if moe else ModelConfig(**fields)
    return Plan(
        model=model,
        data=DataConfig(path=corpus, seq_len=16, global_batch_size=8, micro_batch_size=8 // par["dp_shard_degree"],
                        seed=3),
        optimizer=OptimizerConfig(lr=1e-2),
        schedule=ScheduleConfig(warmup_steps=1),
        training=TrainingConfig(steps=STEPS, seed=7, max_grad_norm=1.0, device=device),
        logging=LoggingConfig(log_every=1000, metrics_path=None, progress_bar=False),
        parallel=ParallelConfig(**par, cp=CPConfig(method="ring")),
        checkpoint=CheckpointConfig(enable_checkpoint=True, folder=folder, interval=SAVED_STEP, load_step=load_step),
    )


def worker(rank: int, world: int, corpus: str, device: str, base: str, out: str) -> None:
    def body(train, quiet, result):
        for layout in LAYOUTS:
            plan = make_plan(corpus, device, layout, os.path.join(base, layout), load_step=0)
            result["uninterrupted"][layout] = train(plan, quiet).losses
        for src, dst in RESUMES:
            folder = os.path.join(base, f"{src}-to-{dst}")
            copy_save(os.path.join(base, src), folder)
            res = train(make_plan(corpus, device, dst, folder, load_step=SAVED_STEP), quiet)
            result["resumed"][f"{src}->{dst}"] = res.losses

    run_resumes(rank, world, device, out, body)
