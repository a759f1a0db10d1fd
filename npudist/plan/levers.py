"""The levers that lower a plan's device memory, each with what it would save for that plan (from the
analytical estimate, ``npudist.plan.estimate``). Torch-free: ``npudist plan check`` and the out-of-memory note
of the training loop both use it."""
from __future__ import annotations

import copy
from dataclasses import dataclass

from npudist.models import model_layout

from .estimate import estimate_rank
from .schema import ParallelDegrees, Plan
from .swap_rules import checkpointed_blocks, every_block_pattern, resolve_swap_blocks


@dataclass
class Lever:
    name: str         # what it is
    setting: str      # the plan keys that turn it on
    saved: int        # device bytes it saves on the rank (estimate; 0 if nothing)


def _blocks(plan: Plan) -> list[str]:
    return list(model_layout(plan.model).blocks)


def _every_block(blocks: list[str]) -> str:
    """The setting naming every block: a pattern over the model's block paths, or the index list when the
    names share no parent."""
    pattern = every_block_pattern(blocks)
    return f"['{pattern}']" if pattern else str(list(range(len(blocks))))


def _with(plan: Plan, change) -> Plan:
    variant = copy.deepcopy(plan)
    change(variant)
    return variant


def memory_levers(plan: Plan, degrees: ParallelDegrees, rank: int) -> list[Lever]:
    """Each lever the plan does not use yet, with the device bytes it saves on ``rank`` (the estimate's peak).
    A lever that the plan already uses fully is left out."""
    base = estimate_rank(plan, degrees, rank).device_bytes
    blocks = _blocks(plan)
    ac = plan.parallel.activation_checkpoint
    levers: list[tuple[str, str, Plan]] = []
    free = sorted(set(range(len(blocks))) - checkpointed_blocks(ac, len(blocks)))
    swapped, _ = resolve_swap_blocks(plan.memory.swap.activations.blocks, blocks)
    if free and set(free) - swapped:
        setting = "memory.swap.activations.blocks: " + (_every_block(blocks) if len(free) == len(blocks)
                                                          else str(free))

        def swap_all(p):
            p.memory.swap.activations.blocks = list(free)
        levers.append(("activation swap", setting, _with(plan, swap_all)))
    if blocks and ac.mode != "full":
        def checkpoint_all(p):
            p.parallel.activation_checkpoint.mode = "full"
            p.memory.swap.activations.blocks = []
        instead = (" with memory.swap.activations.blocks: [] (a block is checkpointed or swapped, not both)"
                   if swapped else "")
        levers.append(("activation checkpointing", "parallel.activation_checkpoint.mode: full" + instead,
                       _with(plan, checkpoint_all)))
    if not plan.memory.swap.optimizer_state and not plan.parallel.fsdp.cpu_offload:
        def swap_state(p):
            p.memory.swap.optimizer_state = True
        levers.append(("optimizer-state swap", "memory.swap.optimizer_state: true", _with(plan, swap_state)))
    micro = plan.data.micro_batch_size
    if micro > 1:
        def halve(p):
            p.data.micro_batch_size = micro // 2
        levers.append(("a smaller micro-batch (same global batch, more accumulation steps)",
                       f"data.micro_batch_size: {micro // 2}", _with(plan, halve)))
    return [Lever(name, setting, max(0, base - estimate_rank(variant, degrees, rank).device_bytes))
            for name, setting, variant in levers]
