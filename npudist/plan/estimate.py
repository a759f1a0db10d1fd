"""Per-rank placement and memory estimate of a plan, computed analytically (no model, no processes).

Parameters are counted exactly from the model spec's layout (``npudist.models``); what each rank holds
follows the real wrappers: pipeline stages own whole blocks (the layout's first-stage modules on the first
stage, its last-stage modules on the last), TP splits the weights its plan shards, expert parallelism
splits the routed experts over ep (outside FSDP), FSDP splits every other parameter over dp_shard x cp
(padded to a multiple). Context parallelism divides each rank's tokens (so its activations) by cp. Models whose layout gives no transformer widths (a user's
own module) get no activation estimate.
Activations are an ESTIMATE: bytes saved for backward per token per block (see ``_block_activation``),
times the tokens of the micro-batches a pipeline schedule keeps in flight.
On npu with hccl, every process group of the rank holds 2 x HCCL_BUFFSIZE of device memory (CANN's
communicator buffers; docs/hccl.md), counted as ``comm_buffer_bytes``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from npudist.models import get_model_spec, model_layout, stage_of_module

from .patterns import matches
from .ranks import process_groups_of_rank, rank_coordinates, stage_layer_ranges, stages_of_rank
from .schema import ParallelDegrees, Plan

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAMW_STATES = 2    # exp_avg, exp_avg_sq (fp32, shaped like the parameter shard)


@dataclass
class RankEstimate:
    rank: int
    coords: dict[str, int]
    stages: list[int]
    blocks: list[int]          # indices into the model layout's blocks
    holds_embedding: bool
    holds_head: bool
    params: int                # parameter elements held by this rank (after TP and FSDP sharding)
    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    gather_bytes: int          # FSDP all-gathered (unsharded) parameters alive at peak
    activation_bytes: int
    offloaded: bool = False    # params/grads/optimizer state live in host memory (fsdp.cpu_offload)
    notes: list[str] = field(default_factory=list)
    swapped_activation_bytes: int = 0   # activations on the host at the peak (memory.swap.activations)
    optim_swapped: bool = False         # optimizer state on the host outside the step (memory.swap)
    communicators: list[str] = field(default_factory=list)   # hccl process groups of the rank (npu + hccl)
    comm_buffer_bytes: int = 0          # 2 x HCCL_BUFFSIZE per communicator, held on the device

    @property
    def device_bytes(self) -> int:
        if self.offloaded:
            return self.gather_bytes + self.activation_bytes + self.comm_buffer_bytes
        if self.optim_swapped:
            # forward/backward peak without the state, or the step's with it (activations freed by then)
            return self.param_bytes + self.grad_bytes + max(self.gather_bytes + self.activation_bytes,
                                                            self.optim_bytes) + self.comm_buffer_bytes
        return (self.param_bytes + self.grad_bytes + self.optim_bytes + self.gather_bytes + self.activation_bytes
                + self.comm_buffer_bytes)


def _numel(shape) -> int:
    return math.prod(shape)


def _module_of(param: str) -> str:
    return param.rsplit(".", 1)[0]


def _tp_sharded(plan: Plan, layout, module: str) -> bool:
    if plan.parallel.tp_degree <= 1:
        return False
    tp_plan = plan.parallel.tp.plan
    if tp_plan is None:
        return any(matches(p, module) for p in layout.tp_sharded)
    return any(matches(p, module) and s in ("colwise", "rowwise") for p, s in tp_plan.items())


def _fsdp_units(plan: Plan, layout) -> list[str]:
    """Modules wrapped as FSDP units, outermost only (as npudist.fsdp chooses them)."""
    wrap = plan.parallel.fsdp.wrap
    patterns = wrap if wrap is not None else get_model_spec(plan.model.name).fsdp_units
    units: list[str] = []
    for name in layout.modules:
        if any(matches(p, name) for p in patterns) and not any(name.startswith(u + ".") for u in units):
            units.append(name)
    return units


def _block_activation(plan: Plan, dims, tp: int) -> tuple[float, float]:
    """(elements per token per block kept for backward, elements per token at a checkpointed block).
    No AC keeps: per RMSNorm its input, normalized value and output (2 x 3*dim, split by TP only with
    sequence parallelism); q and k before and after RoPE, v, the attention output and wo's input (k and v
    repeated to n_heads when GQA groups them), and SwiGLU's w1/w3 outputs, silu and product (4*ffn), split
    by TP."""
    m, par = dims, plan.parallel
    sp = tp if par.tp.sequence_parallel else 1
    kv = m.kv_width
    kv_used = m.q_width                                         # k/v after repeat_interleave to n_heads
    attention = 4 * m.dim + kv + 2 * kv_used                   # q pre/post rope, k pre-rope, k/v, out, wo in
    replicated, sharded = 6 * m.dim / sp, (attention + 4 * m.ffn_hidden)/ tp
    full = replicated + sharded
    ac = par.activation_checkpoint
    if ac.mode == "full":
        return full, m.dim / sp
    if ac.mode == "selective" and ac.selective_policy == "op":
        saved = (2 * m.dim + 2 * kv + 2 * m.ffn_hidden) / tp + m.dim / sp   # matmul outputs + input
        return saved, saved
    return full, full


def _in_flight(plan: Plan, pp_rank: int, n_local: int) -> int:
    """Stage-microbatches whose activations a pipeline rank holds at its peak."""
    par = plan.parallel
    pp, m = par.pp_degree, par.pp.resolved_microbatches(par.pp_degree)
    if pp <= 1:
        return 1
    if par.pp.schedule == "GPipe":
        return m * n_local
    if n_local == 1:   # 1F1B: warm-up of pp - rank forwards before the first backward
        return min(m, pp - pp_rank)
    per_round = m // max(1, m // pp)
    return min(m * n_local, (n_local - 1) * per_round + 2 * (pp - 1 - pp_rank) + 1)


def _activations(plan: Plan, degrees: ParallelDegrees, dims, coords, stages, ranges, first: bool, head: bool,
                 tokens: int, act_bytes: int, swapped: frozenset = frozenset()) -> tuple[int, int]:
    """(activation bytes on the device at the peak, swapped activation bytes on the host then)."""
    par = plan.parallel
    per_layer, per_ckpt_layer = _block_activation(plan, dims, degrees.tp)
    ac = par.activation_checkpoint
    sp = degrees.tp if par.tp.sequence_parallel else 1
    layers_per_stage = max(len(ranges[s]) for s in stages)
    if ac.mode == "selective" and ac.selective_policy == "layer":
        # blocks with a global index divisible by every_n_layers are checkpointed (npudist.fsdp)
        ckpt = max(sum(1 for i in ranges[s] if i % ac.every_n_layers == 0) for s in stages)
        block = (layers_per_stage - ckpt) * per_layer + ckpt * dims.dim / sp
    elif ac.mode == "full":
        block = layers_per_stage * per_ckpt_layer
    else:
        block = layers_per_stage * per_layer
    # Swapped blocks (never checkpointed ones) leave the device; backward holds the block it runs and, when
    # the block before it is swapped too, that one prefetched (npudist.swap.activations).
    n_swapped = max(sum(1 for i in ranges[s] if i in swapped) for s in stages)
    adjacent = any(i in swapped and i - 1 in swapped for s in stages for i in ranges[s])
    block -= n_swapped * per_layer
    fetched = min(n_swapped, 2 if adjacent else 1) * per_layer * tokens * act_bytes
    extra = (dims.dim / sp if first else 0)
    logits = 0
    if head:
        vocab = dims.vocab_size / (degrees.tp if par.tp.loss_parallel and degrees.tp > 1 else 1)
        logits = 3 * vocab * tokens * 4      # fp32 log-softmax output + its gradient + the logits' gradient
    flight = _in_flight(plan, coords["pp"], len(stages))
    recompute = per_layer * tokens * act_bytes if ac.mode == "full" else 0   # one block rebuilt in backward
    activations = int(flight * (block + extra) * tokens * act_bytes + logits + recompute + fetched)
    on_host = int(flight * n_swapped * per_layer * tokens * act_bytes)
    if degrees.cp > 1 and par.cp.method == "ring":
        # ring attention keeps the all-gathered keys and values (whole sequence, repeated to n_heads) of
        # every block for backward, and one query-chunk x key-chunk score block per cp rank's chunk
        gathered = 2 * dims.q_width * tokens * degrees.cp
        activations += int(flight * layers_per_stage * gathered * act_bytes)

    return activations, on_host


def _swapped_blocks(plan: Plan, layout) -> frozenset:
    from .swap_rules import resolve_swap_blocks
    return frozenset(resolve_swap_blocks(plan.memory.swap.activations.blocks, list(layout.blocks))[0])


def hccl_buffer_mb() -> int:
    """HCCL_BUFFSIZE of this process (MB, CANN's default 200): what each communicator holds twice."""
    from npudist import env
    return env.read("HCCL_BUFFSIZE")


def communicators(plan: Plan, degrees: ParallelDegrees) -> list[str]:
    """The hccl communicators a rank holds device buffers for: its process groups when the plan trains on npu
    over hccl (every group moves npu tensors: the loss is reduced over the world group each step)."""
    if plan.training.device != "npu" or "hccl" not in plan.training.resolved_backend:
        return []
    return process_groups_of_rank(degrees)


def estimate_rank(plan: Plan, degrees: ParallelDegrees, rank: int) -> RankEstimate:
    par, d = plan.parallel, plan.data
    layout = model_layout(plan.model)
    coords = rank_coordinates(degrees, rank)
    num_stages = par.pp.num_stages(degrees.pp)
    n_blocks = len(layout.blocks)
    ranges = stage_layer_ranges(n_blocks, num_stages, par.pp.split_points) if n_blocks else [range(0)]
    stages = stages_of_rank(coords["pp"], degrees.pp, par.pp.virtual_stages if degrees.pp > 1 else 1,
                            par.pp.schedule) if degrees.pp > 1 else [0]
    layers = sorted(i for s in stages for i in ranges[s])
    first, head = 0 in stages, num_stages - 1 in stages
    tied_to_last = {owner for owner, user in layout.tied if stage_of_module(layout, user) == ("last",)}
    units = _fsdp_units(plan, layout)

    mine, unit_elems = {}, {}
    experts_held = 0     # expert-parallel expert weights: split over ep, outside FSDP (npudist.ep)
    for name, shape in layout.params.items():
        module = _module_of(name)
        where = stage_of_module(layout, module)
        if where[0] == "block" and where[1] not in layers:
            continue
        if where == ("first",) and not (first or (head and any(module == o or module.startswith(o + ".")
                                                             for o in tied_to_last))):
            continue
        if where == ("last",) and not head:
            continue
        n = _numel(shape)
        if _tp_sharded(plan, layout, module):
            n = math.ceil(n / degrees.tp)
        if degrees.ep > 1 and module in layout.experts:
            experts_held += n // degrees.ep
            continue
        mine[name] = n
        unit = next((u for u in units if module == u or module.startswith(u + ".")), "root")
        unit_elems[unit] = unit_elems.get(unit, 0) + n
    tp_local = sum(mine.values())
    shard = degrees.dp_shard * degrees.cp     # FSDP shards over dp_shard x cp (npudist.mesh)
    held = sum(math.ceil(n / shard) for n in mine.values()) + experts_held
    param_b = DTYPE_BYTES["float32"] * held

    gather = 0
    if shard > 1:
        pbytes = DTYPE_BYTES[par.fsdp.param_dtype]
        # parallelize() keeps parameters gathered under PP (every microbatch would re-gather them).
        if par.fsdp.reshard_after_forward and degrees.pp == 1:
            biggest = sorted(unit_elems.values(), reverse=True)[:2]   # current unit + the prefetched one
            gather = pbytes * sum(biggest)
        else:
            gather = pbytes * tp_local
        gather += DTYPE_BYTES[par.fsdp.reduce_dtype] * max(unit_elems.values(), default=0)   # unsharded grads

    act_bytes = DTYPE_BYTES[par.fsdp.param_dtype] if shard > 1 else 4
    microbatches = par.pp.resolved_microbatches(degrees.pp) if degrees.pp > 1 else 1
    tokens = (d.micro_batch_size // max(1, microbatches)) * d.seq_len // degrees.cp   # cp: a sequence shard
    notes = []
    dims = layout.dims
    if dims is None:
        notes.append("activations not estimated: the model's layout gives no transformer widths")
        activations = on_host = 0
    else:
        activations, on_host = _activations(plan, degrees, dims, coords, stages, ranges, first, head, tokens,
                                            act_bytes, _swapped_blocks(plan, layout))
    if par.fsdp.cpu_offload and shard > 1:
        notes.append("fsdp.cpu_offload: parameters, gradients and optimizer state in host memory")
    groups = communicators(plan, degrees)
    return RankEstimate(
        rank=rank, coords=coords, stages=stages, blocks=layers, holds_embedding=first and bool(layout.first),
        holds_head=head and layout.head is not None,
        params=held, param_bytes=param_b, grad_bytes=param_b, optim_bytes=ADAMW_STATES * param_b,
        gather_bytes=gather, activation_bytes=activations, offloaded=par.fsdp.cpu_offload and shard > 1,
        notes=notes, swapped_activation_bytes=on_host,
        optim_swapped=plan.memory.swap.optimizer_state and not (par.fsdp.cpu_offload and shard > 1),
        communicators=groups, comm_buffer_bytes=len(groups) * 2 * (hccl_buffer_mb() << 20) if groups else 0)


def estimate_all(plan: Plan, degrees: ParallelDegrees) -> list[RankEstimate]:
    return [estimate_rank(plan, degrees, r) for r in range(degrees.world_size)]
