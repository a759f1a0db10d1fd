"""``npudist plan check``: validate a plan for a world size and describe what every rank will hold."""
from __future__ import annotations

import dataclasses
import math

from .ranks import MESH_DIM_NAMES, group_ranks, stage_layer_ranges

from npudist.models import get_model_spec, model_layout

from .estimate import RankEstimate, estimate_all, estimate_rank
from .loader import load_plan
from .schema import ParallelDegrees, Plan


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _span(layers: list[int]) -> str:
    if not layers:
        return "-"
    runs, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ",".join(runs)


def _groups(degrees: ParallelDegrees, dim: str) -> str:
    seen, out = set(), []
    for r in range(degrees.world_size):
        g = tuple(group_ranks(degrees, dim, r))
        if g not in seen:
            seen.add(g)
            out.append("[" + ",".join(map(str, g)) + "]")
    return " ".join(out)


def count_params(model_cfg) -> int:
    """Total parameters of the model (tied weights counted once)."""
    return sum(math.prod(shape) for shape in model_layout(model_cfg).params.values())


def _describe_model(m, n: int) -> str:
    """One line on the model; which variant of a spec the plan selects comes from the spec (so adding a
    spec needs no edit here)."""
    layout = model_layout(m)
    if layout.dims is None:
        shape = f"{len(layout.modules)} modules"
    else:
        shape = (f"dim {m.dim}, {m.n_layers} layers, {m.n_heads} heads ({m.kv_heads} kv), ffn {m.ffn_hidden_dim}, "
                 f"vocab {m.vocab_size}{', tied embeddings' if layout.tied else ''}")
    spec = get_model_spec(m.name)
    what = f" ({spec.variant(m)})" if spec.variant is not None else ""
    return f"model     {m.name}{what}: {shape} -> {n:,} parameters ({format_bytes(4 * n)} fp32)"


def _summary(plan: Plan, degrees: ParallelDegrees, source: str) -> list[str]:
    m, d, par, t = plan.model, plan.data, plan.parallel, plan.training
    n = count_params(m)
    accum = d.grad_accum_steps(degrees.dp)
    lines = [
        f"plan {source}: valid for {degrees.world_size} rank{'s' if degrees.world_size > 1 else ''}",
        _describe_model(m, n),
        f"batch     {d.global_batch_size} sequences x {d.seq_len} tokens = {d.global_batch_size * d.seq_len:,} "
        f"tokens/step; {d.micro_batch_size} per micro-batch on each of {degrees.dp} data-parallel rank(s) -> "
        f"{accum} accumulation step(s)",
        f"training  {t.steps} steps on {t.device} with {t.resolved_backend}; adamw lr {plan.optimizer.lr:g}, "
        f"{plan.schedule.warmup_steps} warmup, {plan.schedule.decay} decay",
    ]
    active = degrees.active_dims()
    omitted = [k for k in MESH_DIM_NAMES if k not in active] + (["ep"] if degrees.ep == 1 else [])
    dims = (" x ".join(f"{k}={v}" for k, v in active.items()) or "dp_shard=1") + (
        f" (ep={degrees.ep} within dp_shard x cp)" if degrees.ep > 1 else "")
    lines.append(f"mesh      {dims} on {t.device}" + (f"   (size-1 dims, no process group: "
                                                       f"{', '.join(omitted)})" if omitted else ""))
    for dim in active:
        lines.append(f"  {dim:<13} groups {_groups(degrees, dim)}")
    if degrees.ep > 1:
        lines.append(f"  {'ep':<13} groups {_groups(degrees, 'ep')}   (borrowed from dp_shard x cp)")
        if degrees.expert_dp > 1:
            lines.append(f"  {'edp':<13} groups {_groups(degrees, 'edp')}   (same experts: expert gradients "
                         "all-reduced)")
    if degrees.cp > 1:
        cp = par.cp
        lines.append(f"context   cp={degrees.cp} {cp.method}, {d.seq_len // degrees.cp} of {d.seq_len} tokens of "
                     f"every sequence per rank" + (" (chunks r and 2cp-1-r: load-balanced causal)"
                                                   if cp.load_balance else ""))
        act = estimate_rank(plan, degrees, 0).activation_bytes
        alone = estimate_rank(plan, dataclasses.replace(degrees, cp=1, ep=1), 0).activation_bytes
        lines.append(f"          activations of rank 0: {format_bytes(act)} (without cp: {format_bytes(alone)})")
    spec = get_model_spec(m.name)
    n_exp = spec.experts(m) if spec.experts is not None else 0
    if n_exp:
        lines.append(f"experts   {n_exp} routed per MoE layer; {n_exp // degrees.ep} per rank (ep={degrees.ep})")
        if degrees.tp > 1 and spec.describe_tp is not None:
            lines += [f"          tp groups {_groups(degrees, 'tp')}: {line}"
                      for line in spec.describe_tp(degrees.tp, d.seq_len)]
    if degrees.pp > 1:
        stages = par.pp.num_stages(degrees.pp)
        mb = par.pp.resolved_microbatches(degrees.pp)
        ranges = stage_layer_ranges(len(model_layout(m).blocks), stages, par.pp.split_points)
        lines.append(f"pipeline  {par.pp.schedule}, {stages} stages ({par.pp.virtual_stages} per rank), {mb} "
                     f"microbatches of {d.micro_batch_size // mb} sequence(s); layers per stage: "
                     + " ".join(f"s{i}={_span(list(r))}" for i, r in enumerate(ranges)))
    if degrees.tp > 1:
        tp = par.tp
        lines.append(f"tensor    {'built-in plan of the model' if tp.plan is None else f'{len(tp.plan)} pattern(s)'}"
                     f", sequence_parallel {tp.sequence_parallel}, loss_parallel {tp.loss_parallel}")
    if degrees.dp_shard > 1:
        f = par.fsdp
        units = f.wrap if f.wrap is not None else get_model_spec(m.name).fsdp_units
        lines.append(f"fsdp      units {', '.join(units) or '-'} + root; param {f.param_dtype}, reduce "
                     f"{f.reduce_dtype}, reshard_after_forward {f.reshard_after_forward}, cpu_offload "
                     f"{f.cpu_offload}")
    ac = par.activation_checkpoint
    if ac.mode != "none":
        lines.append(f"ac        {ac.mode}" + (f" ({ac.selective_policy}"
                                                 + (f", every {ac.every_n_layers} layers)"
                                                    if ac.selective_policy == "layer" else ")")
                                                 if ac.mode == "selective" else ""))
    lines.extend(_hccl_lines(plan, degrees))
    lines.extend(_swap_lines(plan, degrees))
    return lines


def _hccl_lines(plan: Plan, degrees: ParallelDegrees) -> list[str]:
    """The device memory the rank's hccl communicators hold (CANN: 2 x HCCL_BUFFSIZE each)."""
    from .estimate import communicators, hccl_buffer_mb
    groups = communicators(plan, degrees)
    if not groups:
        return []
    mb = hccl_buffer_mb()
    return [f"hccl      {len(groups)} communicator{'s' if len(groups) > 1 else ''} per rank ({', '.join(groups)}) x "
            f"2 x HCCL_BUFFSIZE={mb} MB = {format_bytes(len(groups) * 2 * (mb << 20))} of device memory on every "
            "rank (CANN's communicator buffers, docs/hccl.md; a lower HCCL_BUFFSIZE shrinks them)"]


def _swap_lines(plan: Plan, degrees: ParallelDegrees) -> list[str]:
    """The swap settings with the device memory they save on the busiest rank, and the levers not used yet."""
    from .levers import memory_levers
    from .swap_rules import resolve_swap_blocks
    swap = plan.memory.swap
    estimates = estimate_all(plan, degrees)
    busiest = max(estimates, key=lambda e: e.device_bytes)
    lines = []
    if swap.activations.blocks or swap.optimizer_state:
        plain = dataclasses.replace(plan, memory=type(plan.memory)())
        before = estimate_rank(plain, degrees, busiest.rank).device_bytes
        what = []
        if swap.activations.blocks:
            chosen = sorted(resolve_swap_blocks(swap.activations.blocks, model_layout(plan.model).blocks)[0])
            what.append(f"activations of blocks {_span(chosen)} ({format_bytes(busiest.swapped_activation_bytes)} "
                        "on host at the peak)")
        if swap.optimizer_state:
            what.append(f"optimizer state between steps ({format_bytes(busiest.optim_bytes)})")
        lines.append(f"swap      {'; '.join(what)}; rank {busiest.rank}: {format_bytes(before)} -> "
                     f"{format_bytes(busiest.device_bytes)} of device memory")
    levers = memory_levers(plan, degrees, busiest.rank)
    if levers:
        lines.append(f"levers    device memory each would save on rank {busiest.rank} (docs/memory.md): "
                     + "; ".join(f"{lv.name} ({lv.setting}) {format_bytes(lv.saved)}" for lv in levers))
    return lines


def _rank_table(degrees: ParallelDegrees, estimates: list[RankEstimate]) -> list[str]:
    cp = ("cp",) if degrees.cp > 1 else ()
    cols = ("rank", "stages", "blocks", "dp_rep", "dp_shard", *cp, "tp", "params", "grads", "optim", "fsdp_ag",
            "activ", "hccl", "total")
    rows = []
    for e in estimates:
        c = e.coords
        blocks = _span(e.blocks) + ("+emb" if e.holds_embedding else "") + ("+head" if e.holds_head else "")
        rows.append((str(e.rank), ",".join(map(str, e.stages)), blocks,
                     f"{c['dp_replicate']}/{degrees.dp_replicate}", f"{c['dp_shard']}/{degrees.dp_shard}",
                     *((f"{c['cp']}/{degrees.cp}",) if cp else ()),
                     f"{c['tp']}/{degrees.tp}", format_bytes(e.param_bytes), format_bytes(e.grad_bytes),
                     format_bytes(e.optim_bytes), format_bytes(e.gather_bytes), format_bytes(e.activation_bytes),
                     format_bytes(e.comm_buffer_bytes),
                     format_bytes(e.device_bytes) + (" (state on host)" if e.offloaded else "")))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(cols)]
    left = {"stages", "blocks"}

    def line(cells):
        return "  ".join(c.ljust(w) if h in left else c.rjust(w) for c, w, h in zip(cells, widths, cols))
    return ["per-rank device memory estimate (fp32 params, grads and AdamW state after TP/EP/FSDP sharding; "
            "fsdp_ag = all-gathered units alive at peak; activations estimated for the schedule's peak; hccl = "
            "2 x HCCL_BUFFSIZE per communicator):",
            line(cols), *(line(r) for r in rows)]


def capacity_warnings(plan: Plan, degrees: ParallelDegrees, capacity: int | None = None) -> list[str]:
    """A warning when a rank's estimate exceeds an npu device's memory (``capacity``, default: this process's
    NPUDIST_DEVICE_MEMORY). A warning, not an error: the estimate is an estimate, and the devices of the job
    may be configured larger than this process's."""
    if plan.training.device != "npu":
        return []
    if capacity is None:
        from npudist import env
        capacity = env.read("NPUDIST_DEVICE_MEMORY")
    over = [e for e in estimate_all(plan, degrees) if e.device_bytes > capacity]
    if not over:
        return []
    worst = max(over, key=lambda e: e.device_bytes)
    ranks = "every rank needs" if len(over) == degrees.world_size else f"{len(over)} of {degrees.world_size} ranks need"
    hccl = ""
    if worst.comm_buffer_bytes:
        hccl = (f" ({format_bytes(worst.comm_buffer_bytes)} of it the buffers of {len(worst.communicators)} hccl "
                f"communicators, 2 x HCCL_BUFFSIZE each: a lower HCCL_BUFFSIZE shrinks them)")
    return [f"warning: {ranks} more memory than an npu device has ({format_bytes(capacity)}, NPUDIST_DEVICE_MEMORY): "
            f"rank {worst.rank} an estimated {format_bytes(worst.device_bytes)}{hccl}, so training would run out of "
            "device memory; `npudist plan check` lists the levers that lower it (docs/memory.md)"]


def check_plan(source, world_size: int | None = None, overrides=()) -> tuple[Plan, ParallelDegrees, str]:
    """Load and validate (PlanError lists every problem), then render the layout report."""
    plan = load_plan(source, overrides, world_size=world_size)
    par = plan.parallel
    degrees = par.degrees()
    estimates = estimate_all(plan, degrees)
    name = source if isinstance(source, str) else "<dict>"
    text = "\n".join(_summary(plan, degrees, name) + [""] + _rank_table(degrees, estimates))
    return plan, degrees, text


def report_dict(plan: Plan, degrees: ParallelDegrees) -> dict:
    """Machine-readable form of the report (``npudist plan check --json``)."""
    from .levers import memory_levers
    estimates = estimate_all(plan, degrees)
    busiest = max(estimates, key=lambda e: e.device_bytes)
    return {
        "world_size": degrees.world_size,
        "mesh": degrees.active_dims(),
        "degrees": degrees.sizes(),
        "plan": dataclasses.asdict(plan),
        "ranks": [dict(dataclasses.asdict(e), device_bytes=e.device_bytes) for e in estimates],
        # the levers the plan does not use yet and the device bytes each saves on its busiest rank
        "levers": {"rank": busiest.rank,
                   "levers": [dataclasses.asdict(lv) for lv in memory_levers(plan, degrees, busiest.rank)]},
        "warnings": capacity_warnings(plan, degrees),
    }
