"""The ``memory.swap`` rules: which blocks a plan swaps and which it checkpoints (indices into the model spec's
blocks, in forward order), and what validation reports about them. Torch-free."""
from __future__ import annotations

from .patterns import check_pattern, matches


def every_block_pattern(blocks) -> str | None:
    """The pattern naming every block (``<parent>.*``) when the blocks share one parent module, else None:
    hints and suggested settings are written in the model's own block paths, which only its spec knows."""
    parents = {b.rsplit(".", 1)[0] if "." in b else "" for b in blocks}
    parent = parents.pop() if len(parents) == 1 else None
    return f"{parent}.*" if parent else None


def resolve_swap_blocks(entries, blocks) -> tuple[set[int], list[str]]:
    """Indices named by ``memory.swap.activations.blocks`` entries (an index, a block name or a module-name
    pattern), and one problem line per entry that names no block."""
    chosen: set[int] = set()
    problems: list[str] = []
    n = len(blocks)
    for i, entry in enumerate(entries):
        key = f"memory.swap.activations.blocks[{i}]"
        if isinstance(entry, int):
            if 0 <= entry < n:
                chosen.add(entry)
            else:
                problems.append(f"{key}: block index {entry} is out of range: the model has {n} blocks "
                                f"(0-{n - 1})" if n else f"{key}: the model has no blocks")
            continue
        bad = check_pattern(entry)
        if bad:
            problems.append(f"{key}: {bad}")
            continue
        hits = {j for j, name in enumerate(blocks) if matches(entry, name)}
        if not hits:
            sample = ", ".join(blocks[:3]) + (", ..." if n > 3 else "")
            every = every_block_pattern(blocks)
            forms = (f"a block name or a pattern such as '{every}'" if every else
                     "a block name or a pattern over the block names")
            problems.append(f"{key}: {entry!r} matches none of the model's blocks ({sample or 'none'}); give "
                            f"a block index, {forms}")
        chosen |= hits
    return chosen, problems


def checkpointed_blocks(ac_cfg, n_blocks: int) -> set[int]:
    """Blocks that activation checkpointing recomputes (as ``npudist.fsdp.apply_activation_checkpointing``
    chooses them)."""
    if ac_cfg.mode == "none":
        return set()
    if ac_cfg.mode == "selective" and ac_cfg.selective_policy == "layer":
        return {i for i in range(n_blocks) if i % max(1, ac_cfg.every_n_layers) == 0}
    return set(range(n_blocks))


def swap_plan_problems(plan, layout) -> list[tuple[str, str, tuple[str, ...]]]:
    """The ``memory.swap`` rules: (key, problem and fix, keys read) for each violation. ``layout`` is the
    model's layout, or None when the model section is invalid (block rules are then skipped)."""
    swap = plan.memory.swap
    out: list[tuple[str, str, tuple[str, ...]]] = []
    entries = swap.activations.blocks
    if (entries or swap.optimizer_state) and plan.training.device != "npu":
        out.append(("memory.swap", f"swap moves device memory to the host; with training.device "
                    f"{plan.training.device} there is none to move: set training.device npu or remove "
                    "memory.swap", ("training.device",)))
    if swap.optimizer_state and plan.parallel.fsdp.cpu_offload:
        out.append(("memory.swap.optimizer_state", "parallel.fsdp.cpu_offload already keeps the optimizer "
                    "state (with parameters and gradients) on the host; set one of them to false",
                    ("parallel.fsdp.cpu_offload",)))
    if not entries or layout is None:
        return out
    if not layout.blocks:
        out.append(("memory.swap.activations.blocks", f"the {plan.model.name} model's spec names no blocks to "
                    "swap; register a ModelSpec with blocks or leave the list empty", ("model.name",)))
        return out
    chosen, problems = resolve_swap_blocks(entries, list(layout.blocks))
    for line in problems:
        key, message = line.split(": ", 1)
        out.append((key, message, ("model.n_layers",)))
    ac = plan.parallel.activation_checkpoint
    both = sorted(chosen & checkpointed_blocks(ac, len(layout.blocks)))
    if both:
        rest = sorted(set(range(len(layout.blocks))) - checkpointed_blocks(ac, len(layout.blocks)))
        fix = (f"swap only blocks that are not checkpointed ({rest})" if rest else
               "set parallel.activation_checkpoint.mode to none or selective with every_n_layers > 1")
        out.append(("memory.swap.activations.blocks", f"block(s) {both} are also checkpointed "
                    f"(parallel.activation_checkpoint.mode {ac.mode}): a checkpointed block keeps only its "
                    f"input, which swap cannot move, so swapping it saves nothing; {fix}",
                    ("parallel.activation_checkpoint",)))
    if plan.compile.enable and "model" in plan.compile.components:
        out.append(("memory.swap.activations.blocks", "swapping the activations of compiled blocks is not "
                    "supported yet (untested with AOTAutograd's saved tensors); compile only the loss "
                    "(compile.components: [loss]) or leave the list empty", ("compile.enable",
                                                                             "compile.components")))
    return out
