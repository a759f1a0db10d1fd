"""The training run: plan -> process group -> mesh -> model -> parallelize -> data -> steps.

``run(plan)`` is what ``examples/train.py`` calls after loading the plan. It expects the torchrun/npurun
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); without it, it runs as a one-rank world.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from npudist.compile.apply import describe_compiled
from npudist.data import TextDataset, default_corpus_path
from npudist.mesh import build_mesh, describe_mesh, dim_rank, dim_size
from npudist.models import build_model
from npudist.parallelize import parallelize
from npudist.swap.oom import describe_swap, oom_note
from npudist.swap.optimizer_state import OptimizerStateSwap
from npudist.train.checkpoint import Checkpointer
from npudist.train.metrics import MetricsLogger, reset_peak_memory
from npudist.train.optim import build_lr_scheduler, build_optimizer
from npudist.train.seed import set_seed
from npudist.train.step import NonFiniteLossError, train_step


@dataclass
class RunResult:
    losses: list[float]
    tokens_per_s: float        # median over steps after the first (which includes warm-up work)
    final_step: int


def _init_distributed(plan) -> None:
    if "WORLD_SIZE" not in os.environ:
        # One-rank world (python examples/train.py): a private TCP store on a free port.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if plan.training.device == "npu":
        import npudist
        npudist.register()   # npu device + hccl backend (already done by `import torch` unless autoload is off)
        torch.npu.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(plan.training.resolved_backend)


def _capacity(device: torch.device) -> int | None:
    """The device's memory capacity in bytes (None on cpu)."""
    if device.type == "cpu":
        return None
    return getattr(torch, device.type).get_device_properties(device).total_memory


def _quiet_known_warnings() -> None:
    """Two upstream messages that are noise for this model, printed once per rank:
    * FSDP2 warns that the root returns a view (the TP output's local tensor); the logits are never
      modified in place, which is the only case the warning is about;
    * DTensor warns that the gradient-norm reduction over the 2-D (dp_shard, tp) mesh takes two scalar
      all-reduces instead of one -- negligible next to the step."""
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def expert_load(pm) -> list[int] | None:
    """Routed token slots per expert in the last step, summed over the MoE layers and every rank (None for a
    model without experts). A collective when the model has experts."""
    from npudist.models.moe import take_expert_load
    loads = [row for part in pm.parts for row in take_expert_load(part).values()]
    if not loads:
        return None
    total = torch.tensor(loads, dtype=torch.float64).sum(0).to(pm.device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)   # every rank routes its own tokens (the moe model has no tp or pp copies)
    return [int(x) for x in total.tolist()]


def run(plan, log_stream=None) -> RunResult:
    """Train per ``plan`` (validated for this world size). Raises ``NonFiniteLossError`` on a NaN/inf loss."""
    _quiet_known_warnings()
    _init_distributed(plan)
    try:
        return train(plan, log_stream)
    finally:
        dist.destroy_process_group()


def train(plan, log_stream=None) -> RunResult:
    """The run itself, in an already initialized default process group (``run`` sets one up and tears it
    down; tests run several plans in one group)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = build_mesh(plan.parallel, device_type=plan.training.device)
    set_seed(plan.training.seed, plan.training.deterministic)
    model = build_model(plan.model)   # same init on every rank; parallelize splits and shards it
    n_params = sum(p.numel() for p in model.parameters())   # any model spec's module (tied weights once)
    pm = parallelize(model, plan, mesh)
    del model
    optimizer = build_optimizer(list(pm.named_parameters()), plan.optimizer)
    steps = plan.training.steps
    scheduler = build_lr_scheduler(optimizer, plan.schedule, steps)

    dp, dp_rank = dim_size(mesh, "dp"), dim_rank(mesh, "dp")
    if plan.data.path:
        path = plan.data.path
    else:
        if rank == 0:
            path = default_corpus_path()
        dist.barrier()   # rank 0 generates the corpus once; the others then find it cached
        path = default_corpus_path()
    dataset = TextDataset(path, plan.data.seq_len, plan.data.micro_batch_size, dp_rank=dp_rank,
                          dp_degree=dp, seed=plan.data.seed)
    accum = plan.data.grad_accum_steps(dp)
    tokens_per_step = plan.data.global_batch_size * plan.data.seq_len
    logger = MetricsLogger(plan.logging, steps, tokens_per_step, pm.device, rank, log_stream)
    logger.message(f"npudist train: {world} ranks, {describe_mesh(mesh)} | model {n_params / 1e6:.2f}M params | "
                   f"data {os.path.basename(path)} ({dataset.num_windows} windows of {plan.data.seq_len}) | "
                   f"global batch {plan.data.global_batch_size} = micro {plan.data.micro_batch_size} x dp {dp} "
                   f"x accum {accum} | {steps} steps")
    outputs = logger.describe_outputs()
    if outputs:
        logger.message(outputs)
    ckpt = Checkpointer(plan.checkpoint, pm.parts, optimizer, scheduler, dataset, plan.data.global_batch_size,
                        steps)
    start = ckpt.load()
    for note in ckpt.notes:
        logger.message(note)
    if start:
        logger.message(f"resumed from {plan.checkpoint.folder}/step-{start}")
    # After loading: DCP may step the optimizer once to create its state, which must stay on the device.
    state_swap = OptimizerStateSwap(optimizer, pm.device) if plan.memory.swap.optimizer_state else None
    losses, rates = [], []
    try:
        for step in range(start + 1, steps + 1):
            reset_peak_memory(pm.device)
            t0 = time.perf_counter()
            batches = [dataset.next_batch() for _ in range(accum)]
            lr = scheduler.get_last_lr()[0]
            try:
                loss, grad_norm = train_step(pm, optimizer, scheduler, batches, plan.training.max_grad_norm)
            except torch.OutOfMemoryError as e:
                e.add_note(oom_note(plan, rank, _capacity(pm.device)))
                raise
            except NonFiniteLossError as e:
                raise NonFiniteLossError(
                    f"step {step}: {e} (last finite loss {losses[-1] if losses else 'none'}); stopping. Lower "
                    "optimizer.lr, set training.max_grad_norm, or check the data") from None
            dt = time.perf_counter() - t0
            losses.append(loss)
            rates.append(tokens_per_step / dt)
            logger.log(step, loss, lr, grad_norm, dt, expert_load=expert_load(pm))
            if step == start + 1 and pm.compiled:
                logger.message(describe_compiled(pm.compiled, plan.compile))
            if step == start + 1 and (pm.activation_swaps or state_swap is not None):
                logger.message(describe_swap(pm.activation_swaps, state_swap))
            with state_swap.resident() if state_swap is not None and ckpt.due(step) else contextlib.nullcontext():
                ckpt.maybe_save(step)
    finally:
        logger.close()
    steady = sorted(rates[1:] or rates)
    return RunResult(losses=losses, tokens_per_s=steady[len(steady) // 2] if steady else 0.0,
                     final_step=start + len(losses))
