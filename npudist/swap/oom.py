"""What the training loop says about memory. On an out-of-memory error, a note with the levers that would lower
this plan's device memory and what each would save (estimate): the allocator's own message stays as it is, the
note is added with ``BaseException.add_note`` and printed after it in the traceback. After the first step, a line
with what swap moved to host memory."""
from __future__ import annotations

from npudist.plan.check import format_bytes
from npudist.plan.estimate import estimate_rank

from npudist.plan.levers import memory_levers


def oom_note(plan, rank: int, capacity: int | None) -> str:
    """Lines naming each lever, its plan keys and the device memory it saves on ``rank`` for ``plan``."""
    degrees = plan.parallel.degrees()
    peak = estimate_rank(plan, degrees, rank).device_bytes
    cap = f" against a capacity of {format_bytes(capacity)}" if capacity else ""
    lines = [f"npudist: rank {rank} ran out of device memory training this plan (estimated peak "
             f"{format_bytes(peak)}{cap}; `npudist plan check` shows the estimate). Levers, with the device "
             "memory each saves for this plan (estimate):"]
    levers = memory_levers(plan, degrees, rank)
    for lever in sorted(levers, key=lambda x: -x.saved):
        lines.append(f"  - {lever.name}: {lever.setting} -> saves ~{format_bytes(lever.saved)}")
    if not levers:
        lines.append("  - none left in the plan: every block is swapped or checkpointed, the optimizer state "
                     "is swapped and the micro-batch is 1; use more ranks (parallel degrees) or a smaller model")
    lines.append("See docs/memory.md, 'Training past device memory'.")
    return "\n".join(lines)


def describe_swap(activation_swaps, state_swap) -> str:
    """The log line after the first step: what swap moved to host memory on this rank."""
    parts = []
    if activation_swaps:
        moved = sum(s.bytes_out for s in activation_swaps)
        parts.append(f"activations {format_bytes(moved)} to host in the first step")
    if state_swap is not None:
        parts.append(f"optimizer state {format_bytes(state_swap.host_bytes)} on host between steps")
    return "swap: " + "; ".join(parts)
