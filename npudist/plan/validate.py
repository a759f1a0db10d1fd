"""Cross-field rules of a plan, checked before any process group exists.

Each rule names the key it reports (first) and every key it reads, so a rule is skipped when one of
those keys already failed type conversion (its value is then a default and the message would mislead).
Model-specific rules (shapes, what a model supports) come from the model spec (``npudist.models``);
module patterns are checked against the spec's layout. Validation reads the plan and never changes it.
"""
from __future__ import annotations

import os
import re

from npudist.models import get_model_spec, model_layout, model_spec_names

from .errors import suggest
from .patterns import check_pattern, matches
from .schema import MULTI_STAGE_SCHEDULES, V_SHAPED_SCHEDULES, Plan


class _Checks:
    def __init__(self, skip: set[str]):
        self.skip = skip
        self.errors: list[str] = []

    def _skipped(self, key: str) -> bool:
        return any(key == s or key.startswith(s + ".") or key.startswith(s + "[") or s.startswith(key + ".")
                   for s in self.skip)

    def ok(self, *keys: str) -> bool:
        """True if none of ``keys`` failed conversion (so a rule over them is meaningful)."""
        return not any(self._skipped(k) for k in keys)

    def fail(self, key: str, message: str, *reads: str) -> None:
        if self.ok(key, *reads):
            self.errors.append(f"{key}: {message}")

    def model_ok(self) -> bool:
        return not any(s == "model" or s.startswith("model.") for s in self.skip)


def _positive(c: _Checks, obj, prefix: str, names: tuple[str, ...], minimum: int = 1) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < minimum:
            c.fail(f"{prefix}.{name}", f"must be >= {minimum}, got {value}")


def _check_model(c: _Checks, p: Plan):
    """The model spec's rules; returns the model's layout, or None when it cannot be computed."""
    m = p.model
    if m.vocab_size < 256:
        c.fail("model.vocab_size", f"must be >= 256 for the byte-level tokenizer, got {m.vocab_size}")
    if not c.ok("model.name"):
        return None
    try:
        spec = get_model_spec(m.name)
    except ValueError as e:
        c.errors.append(str(e))
        return None
    if not c.model_ok() or not c.ok("parallel.tp_degree", "parallel.tp"):
        return None
    problems = spec.check(m, p.parallel)
    c.errors.extend(problems)
    if any(x.startswith("model.") for x in problems):   # an invalid model cannot be laid out
        return None
    try:
        return model_layout(m)
    except (ImportError, ValueError) as e:
        c.errors.append(f"model.name: cannot lay out the {m.name} model: {e}")
        return None


def _check_training(c: _Checks, p: Plan) -> None:
    t, o, s, lg = p.training, p.optimizer, p.schedule, p.logging
    _positive(c, t, "training", ("steps",))
    _positive(c, lg, "logging", ("log_every",))
    ck = p.checkpoint
    _positive(c, ck, "checkpoint", ("interval",))
    if ck.load_step < -1:
        c.fail("checkpoint.load_step", f"must be a step >= 1, 0 (fresh start) or -1 (newest), got {ck.load_step}")
    if ck.keep_latest_k < 0:
        c.fail("checkpoint.keep_latest_k", f"must be >= 0 (0 keeps all), got {ck.keep_latest_k}")
    if ck.enable_checkpoint and not ck.folder:
        c.fail("checkpoint.folder", "must name a directory when checkpoint.enable_checkpoint is true")
    if t.max_grad_norm is not None and t.max_grad_norm <= 0:
        c.fail("training.max_grad_norm", f"must be > 0 (or null to disable clipping), got {t.max_grad_norm}")
    if t.backend == "hccl" and t.device != "npu":
        c.fail("training.backend", 'hccl runs collectives on npu tensors: use training.device: npu or '
               'backend: gloo', "training.device")
    if t.backend == "gloo" and t.device != "cpu":
        c.fail("training.backend", 'gloo cannot run collectives on npu tensors: use backend: hccl (or null) '
               'or training.device: cpu', "training.device")
    if o.lr <= 0:
        c.fail("optimizer.lr", f"must be > 0, got {o.lr}")
    for i, b in enumerate(o.betas):
        if not 0 <= b < 1:
            c.fail(f"optimizer.betas[{i}]", f"must be in [0, 1), got {b}")
    if o.eps <= 0:
        c.fail("optimizer.eps", f"must be > 0, got {o.eps}")
    if o.weight_decay < 0:
        c.fail("optimizer.weight_decay", f"must be >= 0, got {o.weight_decay}")
    # warmup_steps > training.steps is allowed on purpose: short smoke runs (--training.steps 3) of a
    # real plan simply end inside the warmup.
    if s.warmup_steps < 0:
        c.fail("schedule.warmup_steps", f"must be >= 0, got {s.warmup_steps}")
    if not 0 <= s.min_lr_ratio <= 1:
        c.fail("schedule.min_lr_ratio", f"must be in [0, 1], got {s.min_lr_ratio}")


def _check_degrees(c: _Checks, p: Plan, world_size: int | None):
    """Resolved ParallelDegrees, or None if the degrees are wrong or the world size is unknown."""
    par = p.parallel
    bad = False
    for name in par.DEGREES:
        if getattr(par, name) < 1:
            c.fail(f"parallel.{name}", f"must be >= 1, got {getattr(par, name)}")
            bad = True
    if par.dp_shard_degree == 0 or par.dp_shard_degree < -1:
        c.fail("parallel.dp_shard_degree", f"must be >= 1 or -1 (= the rest), got {par.dp_shard_degree}")
        bad = True
    if world_size is not None and world_size < 1:
        c.errors.append(f"world_size: must be >= 1, got {world_size}")
        bad = True
    if bad or not c.ok("parallel.dp_shard_degree", *(f"parallel.{n}" for n in par.DEGREES)):
        return None
    if world_size is None:
        if par.dp_shard_degree == -1:
            return None   # world-size dependent rules wait for load_plan(..., world_size=N)
        world_size = (par.dp_shard_degree * par.dp_replicate_degree * par.tp_degree * par.pp_degree
                      * par.cp_degree)
    try:
        return par.resolve(world_size)
    except ValueError as e:
        c.errors.append(str(e))
        return None


def _generic(name: str) -> str:
    """"<blocks>.3.<sub>" -> "<blocks>.*.<sub>": block indices become wildcards for hints."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name)


def _check_pattern_hits(c: _Checks, p: Plan, layout, key: str, pattern: str) -> None:
    """A module pattern must be well formed and match at least one module of the model: a typo would
    otherwise silently leave modules unsharded."""
    problem = check_pattern(pattern)
    if problem:
        c.fail(key, problem)
        return
    if layout is None:
        return
    if not any(matches(pattern, n) for n in layout.modules):
        generic = sorted({_generic(n) for n in layout.modules})
        c.fail(key, f'pattern "{pattern}" matches no module of the {p.model.name} model'
               f"{suggest(pattern, generic)}", "model.n_layers")


def _check_tp(c: _Checks, p: Plan, layout, tp: int) -> None:
    cfg = p.parallel.tp
    for pattern, _style in (cfg.plan or {}).items():
        _check_pattern_hits(c, p, layout, f"parallel.tp.plan.{pattern}", pattern)
    if cfg.async_tp:
        _check_async_tp(c, p, tp)
    if tp <= 1:
        return
    reads = ("parallel.tp_degree",)
    if cfg.loss_parallel and layout is not None and layout.head is None:
        c.fail("parallel.tp.loss_parallel", f"the {p.model.name} model names no output head to keep "
               "vocab-sharded; set it to false", *reads)
    if cfg.sequence_parallel and p.data.seq_len % tp:
        c.fail("parallel.tp.sequence_parallel", f"needs data.seq_len={p.data.seq_len} divisible by "
               f"parallel.tp_degree={tp}", *reads, "data.seq_len")


def _check_async_tp(c: _Checks, p: Plan, tp: int) -> None:
    reads = ("parallel.tp_degree", "parallel.tp.sequence_parallel", "training.device")
    if tp <= 1:
        c.fail("parallel.tp.async_tp", f"needs tensor parallelism (parallel.tp_degree > 1, got {tp}); set it "
               "to false", *reads)
    elif not p.parallel.tp.sequence_parallel:
        c.fail("parallel.tp.async_tp", "fuses the sequence-parallel all-gather/reduce-scatter with the matmuls: "
               "set parallel.tp.sequence_parallel: true", *reads)
    if p.training.device != "npu" or p.training.resolved_backend != "hccl":
        c.fail("parallel.tp.async_tp", "the MC2 operators run on npu over hccl: set training.device: npu (and "
               "training.backend: hccl or null)", *reads, "training.backend")


def split_indices(points, blocks) -> list[int] | None:
    """Split points as block indices: ints stay, "N" and block names (the layout's ``blocks``) become indices.
    None if some point is neither."""
    out = []
    for point in points:
        if isinstance(point, str):
            name = point.strip()
            if name.isdigit():
                point = int(name)
            elif name in blocks:
                point = list(blocks).index(name)
            else:
                return None
        out.append(point)
    return out


def _check_pp(c: _Checks, p: Plan, layout, pp_degree: int) -> None:
    cfg = p.parallel.pp
    _positive(c, cfg, "parallel.pp", ("virtual_stages", "microbatches"))
    blocks = layout.blocks if layout is not None else ()
    points = None
    if cfg.split_points is not None:
        points = split_indices(cfg.split_points, blocks)
        if points is None:
            bad = next(x for x in cfg.split_points if split_indices([x], blocks) is None)
            c.fail(f"parallel.pp.split_points[{cfg.split_points.index(bad)}]",
                   f"expected a block index or a block name "
                   f"({re.sub(r'[0-9]+$', 'N', blocks[0]) if blocks else 'no blocks'}), got {bad!r}")
            return
    if cfg.virtual_stages < 1 or (cfg.microbatches is not None and cfg.microbatches < 1):
        return
    if cfg.schedule in MULTI_STAGE_SCHEDULES and pp_degree > 1 and cfg.virtual_stages < 2:
        c.fail("parallel.pp.virtual_stages", f"schedule {cfg.schedule} runs several stages per rank: set "
               "virtual_stages >= 2 (or use schedule 1F1B/GPipe)", "parallel.pp.schedule")
    if cfg.schedule in V_SHAPED_SCHEDULES and pp_degree > 1 and cfg.virtual_stages != 2:
        c.fail("parallel.pp.virtual_stages", f"schedule {cfg.schedule} needs exactly 2 stages per rank, got "
               f"{cfg.virtual_stages}", "parallel.pp.schedule")
    if cfg.schedule not in MULTI_STAGE_SCHEDULES and cfg.virtual_stages != 1:
        c.fail("parallel.pp.virtual_stages", f"schedule {cfg.schedule} runs one stage per rank: set "
               f"virtual_stages 1 or use Interleaved1F1B/InterleavedZeroBubble/ZBVZeroBubble",
               "parallel.pp.schedule")
    if pp_degree <= 1:
        if cfg.split_points:
            c.fail("parallel.pp.split_points", "given but parallel.pp_degree is 1 (no pipeline)",
                   "parallel.pp_degree")
        return
    stages = cfg.num_stages(pp_degree)
    mb = cfg.resolved_microbatches(pp_degree)
    reads = ("parallel.pp_degree", "parallel.pp.virtual_stages")
    if layout is not None and not get_model_spec(p.model.name).supports_pipeline:
        c.fail("parallel.pp_degree", f"the {p.model.name} model cannot be pipelined (its spec does not split it "
               "into stages); set parallel.pp_degree: 1 or register a ModelSpec with supports_pipeline=True")
        layout = None
    if mb < pp_degree:
        c.fail("parallel.pp.microbatches", f"{mb} is fewer than the {pp_degree} pipeline ranks: stages would sit "
               f"idle and torch's 1F1B rejects it; use >= {pp_degree}", *reads)
    elif cfg.schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, mb // pp_degree)
        if mb % rounds:
            c.fail("parallel.pp.microbatches", f"{cfg.schedule} needs microbatches to be a multiple of "
                   f"microbatches // pp_degree = {rounds}, got {mb}", *reads, "parallel.pp.schedule")
    n_layers = len(blocks)
    if layout is None:
        pass
    elif n_layers < stages:
        c.fail("model.n_layers", f"{n_layers} layers cannot fill {stages} pipeline stages (pp_degree "
               f"{pp_degree} x virtual_stages {cfg.virtual_stages})", *reads)
    elif points is None:
        if n_layers % stages:
            c.fail("model.n_layers", f"{n_layers} is not divisible by the {stages} pipeline stages (pp_degree "
                   f"{pp_degree} x virtual_stages {cfg.virtual_stages}); change n_layers or give "
                   "parallel.pp.split_points", *reads, "parallel.pp.split_points")
    elif points is not None:
        if len(points) != stages - 1:
            c.fail("parallel.pp.split_points", f"needs {stages - 1} points for {stages} stages, got "
                   f"{len(points)}", *reads)
        elif any(b <= a for a, b in zip(points, points[1:])) or points[0] < 1 or points[-1] > n_layers - 1:
            c.fail("parallel.pp.split_points", f"{points} must be strictly increasing layer indices in "
                   f"[1, {n_layers - 1}] (each stage needs at least one layer)", "model.n_layers")
    if layout is not None and layout.tied:
        c.fail("model.tie_embeddings", "tied embeddings put one weight on the first and the last pipeline "
               "stage; set tie_embeddings: false with parallel.pp_degree > 1", "parallel.pp_degree")
    if p.data.micro_batch_size % mb:
        c.fail("data.micro_batch_size", f"{p.data.micro_batch_size} is not divisible by "
               f"parallel.pp.microbatches={mb} (the pipeline splits each micro batch into microbatches)",
               *reads, "parallel.pp.microbatches")


def _check_data(c: _Checks, p: Plan, dp: int | None) -> None:
    d = p.data
    _positive(c, d, "data", ("seq_len", "global_batch_size", "micro_batch_size"))
    if d.path is not None and not os.path.isfile(d.path):
        c.fail("data.path", f"{d.path!r} is not a readable file (relative paths are from the working "
               f"directory {os.getcwd()}); use null for the built-in corpus")
    if d.seq_len > p.model.max_seq_len:
        c.fail("data.seq_len", f"{d.seq_len} exceeds model.max_seq_len={p.model.max_seq_len}",
               "model.max_seq_len")
    if dp is None or d.micro_batch_size < 1 or d.global_batch_size < 1:
        return
    per_step = d.micro_batch_size * dp
    if d.global_batch_size % per_step:
        c.fail("data.global_batch_size", f"{d.global_batch_size} is not divisible by data.micro_batch_size "
               f"{d.micro_batch_size} x {dp} data-parallel ranks = {per_step}", "data.micro_batch_size",
               "parallel.dp_shard_degree", "parallel.dp_replicate_degree")


def _spec_names(has) -> str:
    """The registered model specs with a capability, for a message: plug-in specs are named as the built-in
    ones are, and this layer names no model itself."""
    return ", ".join(n for n in model_spec_names() if has(get_model_spec(n))) or "none registered"


def _check_cp(c: _Checks, p: Plan, layout, cp: int) -> None:
    """Context parallel: the model must support it and every sequence must split evenly."""
    if cp <= 1:
        return
    par, m = p.parallel, p.model
    reads = ("parallel.cp_degree",)
    if layout is not None and not get_model_spec(m.name).supports_context_parallel:
        names = _spec_names(lambda spec: spec.supports_context_parallel)
        c.fail("parallel.cp_degree", f"the {m.name} model does not support context parallelism (its spec has "
               f"no sharded-sequence attention); set parallel.cp_degree: 1 or use a model whose spec supports "
               f"it (model.name: {names})")
    chunks = 2 * cp if par.cp.load_balance else cp
    if p.data.seq_len % chunks:
        how = (f"2 x parallel.cp_degree = {chunks} (load-balanced causal sharding cuts it into 2 x cp chunks)"
               if par.cp.load_balance else f"parallel.cp_degree = {cp}")
        c.fail("data.seq_len", f"{p.data.seq_len} is not divisible by {how}; use a multiple of {chunks}",
               *reads, "parallel.cp.load_balance")
    if par.pp_degree > 1:
        c.fail("parallel.cp_degree", "context parallelism with pipeline parallelism (pp_degree > 1) is not "
               "supported yet; set one of them to 1", "parallel.pp_degree")
    if par.tp_degree > 1:
        c.fail("parallel.cp_degree", "context parallelism with tensor parallelism (tp_degree > 1) is not "
               "supported yet; set one of them to 1", "parallel.tp_degree")
    if par.cp.method == "ulysses" and layout is not None and c.model_ok():
        # k and v are repeated to n_heads before attention, so only the query heads must divide.
        if m.n_heads % cp:
            c.fail("model.n_heads", f"{m.n_heads} heads cannot be split over parallel.cp_degree={cp} (Ulysses "
                   "gives each cp rank whole heads); use parallel.cp.method ring or a divisible head count",
                   *reads, "parallel.cp.method")


def _check_ep(c: _Checks, p: Plan, layout, ep: int) -> None:
    """Expert parallel: the model must have experts, and they must split evenly over the ep ranks."""
    if ep <= 1 or layout is None:
        return
    spec = get_model_spec(p.model.name)
    experts = spec.experts(p.model) if spec.experts is not None else 0
    if not experts:
        names = _spec_names(lambda spec: spec.experts is not None)
        c.fail("parallel.ep_degree", f"the {p.model.name} model has no experts to split; set "
               f"parallel.ep_degree: 1 or use a mixture-of-experts configuration of a model whose spec has "
               f"routed experts (model.name: {names})")
    elif experts % ep:
        c.fail("parallel.ep_degree", f"the model's {experts} experts cannot be split evenly over {ep} ep ranks; "
               f"use an ep_degree dividing {experts} or change model.n_experts", "model.n_experts")


def _check_fsdp_ac(c: _Checks, p: Plan, layout) -> None:
    for i, pattern in enumerate(p.parallel.fsdp.wrap or ()):
        _check_pattern_hits(c, p, layout, f"parallel.fsdp.wrap[{i}]", pattern)
    ac = p.parallel.activation_checkpoint
    if ac.every_n_layers < 1:
        c.fail("parallel.activation_checkpoint.every_n_layers", f"must be >= 1, got {ac.every_n_layers}")


def _check_compile(c: _Checks, p: Plan, layout) -> None:
    cfg = p.compile
    seen = set()
    for i, component in enumerate(cfg.components):
        if component in seen:
            c.fail(f"compile.components[{i}]", f"{component!r} is listed twice; list each component once")
        seen.add(component)
    if not cfg.enable:
        return
    if not cfg.components:
        c.fail("compile.components", "is empty, so compile.enable: true would compile nothing; list model "
               "and/or loss, or set compile.enable: false", "compile.enable")
    if "model" in cfg.components and layout is not None and not layout.blocks:
        c.fail("compile.components", f"model: the {p.model.name} model's spec names no blocks, and graph mode "
               "compiles a model block by block (FSDP's hooks stay between blocks); register a ModelSpec with "
               "blocks or compile only the loss", "compile.enable", "model.name")
    ac = p.parallel.activation_checkpoint.mode
    if "model" in cfg.components and ac != "none":
        # Measured (torch 2.13): selective op-level AC compiles, but full/layer AC recomputes SDPA, a seeded op, and
        # AOTAutograd wraps it in run_and_save_rng_state / run_with_rng_state, whose kernels know only
        # cuda/cpu/hpu/xpu (a fixed table inside torch, no registration API). Rejected for every mode until
        # that works, so the combination is absent, not half-working.
        c.fail("compile.components", f"model: compiling blocks under parallel.activation_checkpoint.mode "
               f"{ac} is not supported yet (torch's RNG-state operators for recomputation have no npu "
               "kernel); set "
               "activation_checkpoint.mode: none or compile only the loss", "compile.enable",
               "parallel.activation_checkpoint.mode")


def _check_swap(c: _Checks, p: Plan, layout) -> None:
    from .swap_rules import swap_plan_problems
    for key, message, reads in swap_plan_problems(p, layout):
        c.fail(key, message, *reads)


def validate_plan(plan: Plan, world_size: int | None = None, skip: set[str] | None = None) -> list[str]:
    """All rule violations as ``"key.path: problem"`` lines (the plan is not changed)."""
    c = _Checks(set(skip or ()))
    layout = _check_model(c, plan)
    _check_training(c, plan)
    _check_fsdp_ac(c, plan, layout)
    degrees = _check_degrees(c, plan, world_size)
    par = plan.parallel
    _check_tp(c, plan, layout, par.tp_degree if par.tp_degree >= 1 else 1)
    _check_pp(c, plan, layout, par.pp_degree if par.pp_degree >= 1 else 1)
    _check_cp(c, plan, layout, par.cp_degree)
    _check_ep(c, plan, layout, par.ep_degree)
    _check_data(c, plan, degrees.dp if degrees else None)
    _check_compile(c, plan, layout)
    _check_swap(c, plan, layout)
    return c.errors


def resolve_plan(plan: Plan, world_size: int | None) -> None:
    """Fill in what validation established, on a plan that passed ``validate_plan``: ``dp_shard_degree``
    -1 from the world size, block names in ``pp.split_points`` as indices."""
    par = plan.parallel
    if world_size is not None and par.dp_shard_degree == -1:
        par.dp_shard_degree = par.resolve(world_size).dp_shard
    if par.pp.split_points is not None:
        par.pp.split_points = split_indices(par.pp.split_points, model_layout(plan.model).blocks)
