"""Worker of the cross-layout resume test: in one 2-rank process group, train a tiny model uninterrupted under
each layout (saving at steps 2 and 4), then resume every layout's step-2 save under each other layout, and try
a resume with a changed global batch size. Rank 0 writes the losses and the refusal message as JSON."""
from __future__ import annotations

import io
import json
import os
import shutil

import torch
import torch.distributed as dist

from npudist.plan import (CheckpointConfig, DataConfig, LoggingConfig, ModelConfig, OptimizerConfig,
                          ParallelConfig, Plan, PPConfig, ScheduleConfig, TrainingConfig)

STEPS = 4
SAVED_STEP = 2
# Two ranks each; global batch 8 in 2 accumulation steps under every layout.
LAYOUTS = {
    "fsdp": dict(dp_shard_degree=2),
    "tp": dict(dp_shard_degree=1, tp_degree=2),
    "pp": dict(dp_shard_degree=1, pp_degree=2, pp=PPConfig(schedule="1F1B", microbatches=2)),
}
# One extra pair: an interleaved pipeline holds two stage modules per rank (part indices 0 and 1), whose
# state must load into one FSDP module.
EXTRA = {"pp_interleaved": dict(dp_shard_degree=1, pp_degree=2,
                                pp=PPConfig(schedule="Interleaved1F1B", microbatches=2, virtual_stages=2))}


def make_plan(corpus: str, device: str, layout: str, folder: str, load_step: int, global_batch: int = 8) -> Plan:
    par = {**LAYOUTS, **EXTRA}[layout]
    dp = par["dp_shard_degree"]
    return Plan(
        model=ModelConfig(vocab_size=256, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64,
                          max_seq_len=32),
        data=DataConfig(path=corpus, seq_len=16, global_batch_size=global_batch, micro_batch_size=4 // dp, seed=3),
        optimizer=OptimizerConfig(lr=1e-2),
        schedule=ScheduleConfig(warmup_steps=1),
        training=TrainingConfig(steps=STEPS, seed=7, max_grad_norm=1.0, device=device),
        logging=LoggingConfig(log_every=1000, metrics_path=None, progress_bar=False),
        parallel=ParallelConfig(**par),
        checkpoint=CheckpointConfig(enable_checkpoint=True, folder=folder, interval=SAVED_STEP, load_step=load_step),
    )


def copy_save(src: str, dst: str) -> None:
    """A fresh folder holding only ``src``'s step-2 save (each resume saves step 4 into its own folder)."""
    if dist.get_rank() == 0:
        shutil.copytree(os.path.join(src, f"step-{SAVED_STEP}"), os.path.join(dst, f"step-{SAVED_STEP}"))
    dist.barrier()


def run_resumes(rank: int, world: int, device: str, out: str, body) -> None:
    """In a fresh process group (npu + hccl or cpu + gloo): ``body(train, quiet)`` fills a result dict with
    ``uninterrupted`` and ``resumed`` losses, which rank 0 writes to ``out`` as JSON."""
    from npudist.train.trainer import train

    if device == "npu":
        import npudist  # noqa: F401  (registers the npu device and the hccl backend)
        torch.npu.set_device(rank)
    dist.init_process_group("hccl" if device == "npu" else "gloo", rank=rank, world_size=world)
    try:
        result = {"uninterrupted": {}, "resumed": {}}
        body(train, io.StringIO(), result)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def worker(rank: int, world: int, corpus: str, device: str, base: str, out: str) -> None:
    def body(train, quiet, result):
        for layout in LAYOUTS:
            plan = make_plan(corpus, device, layout, os.path.join(base, layout), load_step=0)
            result["uninterrupted"][layout] = train(plan, quiet).losses
        # Resuming under the saving layout itself is covered (bit for bit) by the kill-during-save test.
        pairs = [(a, b) for a in LAYOUTS for b in LAYOUTS if a != b] + [("pp_interleaved", "fsdp")]
        for src, dst in pairs:
            folder = os.path.join(base, f"{src}-to-{dst}")
            if src in EXTRA:
                train(make_plan(corpus, device, src, os.path.join(base, src), load_step=0), quiet)
            copy_save(os.path.join(base, src), folder)
            res = train(make_plan(corpus, device, dst, folder, load_step=SAVED_STEP), quiet)
            result["resumed"][f"{src}->{dst}"] = res.losses
        try:
            train(make_plan(corpus, device, "tp", os.path.join(base, "fsdp"), load_step=SAVED_STEP,
                            global_batch=16), quiet)
            result["refused"] = None
        except ValueError as e:
            result["refused"] = str(e)

    run_resumes(rank, world, device, out, body)
