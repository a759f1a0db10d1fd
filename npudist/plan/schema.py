"""Dataclasses of a training plan: one YAML file -> one ``Plan``.

The field types are the schema: ``npudist.plan.loader`` converts YAML (and CLI overrides) into these
classes by reading the annotations, so a field added here is parsed, type-checked and overridable at once.
Cross-field rules (degrees vs world size, divisibility, ...) live in ``npudist.plan.validate``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

# The model section's class lives with the model specs (a spec with fields of its own subclasses it).
from npudist.models.config import ModelConfig

TPStyle = Literal["colwise", "rowwise", "sequence_parallel", "prepare_input"]
PPSchedule = Literal["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "InterleavedZeroBubble"]
DType = Literal["float32", "bfloat16", "float16"]

# Schedules that run several stages per rank (virtual_stages > 1), and the one that needs exactly two.
MULTI_STAGE_SCHEDULES = ("Interleaved1F1B", "ZBVZeroBubble", "InterleavedZeroBubble")
V_SHAPED_SCHEDULES = ("ZBVZeroBubble",)


@dataclass
class DataConfig:
    path: Optional[str] = None     # text file; None = the built-in corpus
    seq_len: int = 128
    global_batch_size: int = 8     # sequences per optimizer step, summed over all data-parallel ranks
    micro_batch_size: int = 2      # sequences per forward/backward on one data-parallel rank
    seed: int = 0                  # shuffling seed of the dataset

    def grad_accum_steps(self, dp_degree: int) -> int:
        """Micro-batches accumulated per optimizer step on each data-parallel rank."""
        return self.global_batch_size // (self.micro_batch_size * dp_degree)


@dataclass
class OptimizerConfig:
    name: Literal["adamw"] = "adamw"
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1


@dataclass
class ScheduleConfig:
    """Learning-rate schedule: linear warmup to optimizer.lr, then decay to lr * min_lr_ratio."""
    warmup_steps: int = 10
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.1


@dataclass
class TrainingConfig:
    steps: int = 100
    seed: int = 0
    max_grad_norm: Optional[float] = 1.0   # None = no clipping
    device: Literal["npu", "cpu"] = "npu"
    backend: Optional[Literal["hccl", "gloo"]] = None  # None = hccl on npu, gloo on cpu
    deterministic: bool = True

    @property
    def resolved_backend(self) -> str:
        if self.backend is not None:
            return self.backend
        return "hccl" if self.device == "npu" else "gloo"


@dataclass
class LoggingConfig:
    log_every: int = 1
    metrics_path: Optional[str] = None     # JSON lines, one record per logged step; None = no file
    progress_bar: bool = True


@dataclass
class CheckpointConfig:
    """Model, optimizer, LR schedule, data position and step, saved with torch.distributed.checkpoint.
    Field names are torchtitan's ([checkpoint] section)."""
    enable_checkpoint: bool = False
    folder: str = "checkpoints"            # one step-<N> subfolder per save
    interval: int = 500                    # save every `interval` steps, and after the last step
    load_step: int = -1                    # resume from step-<N>; -1 = the newest in `folder`; 0 = fresh start
    keep_latest_k: int = 0                 # delete all but the k most recently written saves (0 = keep all)
    # A fresh start (load_step 0) into a folder that holds saves is refused unless this is true: the run may then
    # replace those saves (same step) and, with keep_latest_k, delete them as older than its own.
    overwrite: bool = False
    # Resuming a damaged save (a file missing or shorter than written, an unreadable .metadata) is an error that
    # names the file and offers the newest intact save; true takes that save instead.
    skip_damaged: bool = False


@dataclass
class FSDPConfig:
    reshard_after_forward: bool = True
    param_dtype: DType = "float32"         # dtype of all-gathered parameters for compute
    reduce_dtype: DType = "float32"        # dtype of gradient reduce-scatter
    cpu_offload: bool = False
    # Module-name patterns (see npudist.plan.patterns) wrapped as separate FSDP units, in addition to the
    # root which is always wrapped last. None = the model spec's units (ModelSpec.fsdp_units).
    wrap: Optional[list[str]] = None


@dataclass
class TPConfig:
    # Module-name pattern -> style. None = the model's built-in TP plan.
    plan: Optional[dict[str, TPStyle]] = None
    loss_parallel: bool = False            # keep logits sharded over the vocab through the loss
    sequence_parallel: bool = False        # shard norms/residual activations over the sequence dim
    # the sequence-parallel linear pairs on the MC2 operators (all-gather/reduce-scatter overlapped with the
    # matmul, npudist.tp.async_tp); needs tp_degree > 1, sequence_parallel and the npu device
    async_tp: bool = False


@dataclass
class PPConfig:
    schedule: PPSchedule = "1F1B"
    microbatches: Optional[int] = None     # per optimizer micro-step; None = number of pipeline stages
    # Block indices where a new stage starts (len = stages - 1); block names, as the model spec's layout
    # lists its blocks (ModelLayout.blocks), are accepted too. None = the blocks split evenly over the stages.
    split_points: Optional[list[Union[int, str]]] = None
    virtual_stages: int = 1                # stages per pp rank (>1 for interleaved / ZBV schedules)

    def num_stages(self, pp_degree: int) -> int:
        return pp_degree * self.virtual_stages

    def resolved_microbatches(self, pp_degree: int) -> int:
        return self.microbatches if self.microbatches is not None else self.num_stages(pp_degree)


@dataclass
class ACConfig:
    """Activation checkpointing. selective: policy "layer" checkpoints every ``every_n_layers``-th block,
    policy "op" recomputes cheap ops but saves matmul outputs inside every block."""
    mode: Literal["none", "full", "selective"] = "none"
    selective_policy: Literal["layer", "op"] = "layer"
    every_n_layers: int = 2


CompileComponent = Literal["model", "loss"]


@dataclass
class CompileConfig:
    """Graph mode (``torch.compile``), torchtitan's ``[compile]`` section. ``model`` compiles each block of the
    model spec (after tensor parallelism and activation checkpointing, before FSDP), ``loss`` the loss function."""
    enable: bool = False
    components: list[CompileComponent] = field(default_factory=lambda: ["model", "loss"])
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"   # aot_eager/eager: debugging aids


@dataclass
class CPConfig:
    """Context parallelism (``parallel.cp_degree`` > 1): every sequence is split over the cp ranks."""
    # How attention sees the whole sequence: "ring" gathers the keys/values of the other cp ranks and merges
    # per-chunk softmax results (online softmax); "ulysses" trades the sequence shard for a head shard with
    # an all-to-all, runs ordinary attention on whole sequences, and trades back.
    method: Literal["ring", "ulysses"] = "ring"
    # Causal attention gives late tokens more work than early ones; load balancing gives cp rank r the
    # sequence chunks r and 2*cp-1-r (of 2*cp equal chunks) so every rank attends over the same area.
    load_balance: bool = True


@dataclass
class ActivationSwapConfig:
    """Activation swap: the tensors the chosen blocks save for backward go to pinned host memory on a side
    stream during forward and are prefetched back, one block ahead, during backward (``npudist.swap``)."""
    # Blocks of the model spec, as indices (0 = first), block names as the spec's layout lists them
    # (ModelLayout.blocks) or module-name patterns over those names ("<parent>.*" = every block). Empty = no
    # activation swap. A block cannot also be checkpointed.
    blocks: list[Union[int, str]] = field(default_factory=list)


@dataclass
class SwapConfig:
    activations: ActivationSwapConfig = field(default_factory=ActivationSwapConfig)
    # AdamW state in pinned host memory between steps, brought to the device for the step.
    optimizer_state: bool = False


@dataclass
class MemoryConfig:
    """Training past device memory: what is moved to host memory (see docs/memory.md)."""
    swap: SwapConfig = field(default_factory=SwapConfig)


@dataclass(frozen=True)
class ParallelDegrees:
    """Concrete degrees (no -1). Mesh dims in mesh order (pp, dp_replicate, dp_shard, cp, tp); ``ep`` is no
    dim of its own: as in torchtitan it borrows ranks from dp_shard x cp (see ``npudist.mesh``)."""
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    cp: int = 1
    ep: int = 1

    DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Number of data-parallel ranks (replicas x shards): how many ways the batch is split."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_shard_in_ep(self) -> int:
        """The part of dp_shard that expert parallelism borrows (the rest of ep comes from cp)."""
        return self.ep // self.cp if self.ep > 1 else 1

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts (replicas that all-reduce expert gradients)."""
        return self.dp_replicate * self.dp_shard * self.cp // self.ep

    def sizes(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.DIM_NAMES}

    def active_dims(self) -> dict[str, int]:
        """Dims of size > 1, in mesh order: the only ones that get a process group."""
        return {n: s for n, s in self.sizes().items() if s > 1}


@dataclass
class ParallelConfig:
    """The parallel layout. The degrees multiply to the world size:
    pp x dp_replicate x dp_shard x cp x tp; ep_degree re-uses ranks of dp_shard x cp (it must divide that
    product and be a multiple of cp_degree)."""
    dp_replicate_degree: int = 1           # whole-model replicas (DDP; with dp_shard > 1: HSDP)
    dp_shard_degree: int = -1              # FSDP2 shards; -1 = whatever world size the other degrees leave
    tp_degree: int = 1                     # tensor parallel (Megatron column/row split of each block)
    pp_degree: int = 1                     # pipeline stages
    cp_degree: int = 1                     # context parallel: each sequence split over cp ranks (see cp)
    ep_degree: int = 1                     # expert parallel: a model's experts split over ep ranks (MoE specs)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    tp: TPConfig = field(default_factory=TPConfig)
    pp: PPConfig = field(default_factory=PPConfig)
    cp: CPConfig = field(default_factory=CPConfig)
    activation_checkpoint: ACConfig = field(default_factory=ACConfig)

    DEGREES = ("dp_replicate_degree", "tp_degree", "pp_degree", "cp_degree", "ep_degree")

    def resolve(self, world_size: int) -> ParallelDegrees:
        """Fill dp_shard_degree=-1 from ``world_size``; ValueError if the degrees do not fit it."""
        others = self.dp_replicate_degree * self.tp_degree * self.pp_degree * self.cp_degree
        for name in self.DEGREES:
            if getattr(self, name) < 1:
                raise ValueError(f"parallel.{name}: must be >= 1, got {getattr(self, name)}")
        if world_size < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        shard = self.dp_shard_degree
        if shard == -1:
            if world_size % others:
                raise ValueError(
                    f"parallel.dp_shard_degree: -1 cannot be filled: world size {world_size} is not divisible "
                    f"by dp_replicate_degree*tp_degree*pp_degree*cp_degree = {others}")
            shard = world_size // others
        elif shard < 1:
            raise ValueError(f"parallel.dp_shard_degree: must be >= 1 or -1 (= the rest), got {shard}")
        elif shard * others != world_size:
            # -1 is a fix only where it can be filled: the other degrees must divide the world size.
            fix = (f"set parallel.dp_shard_degree to -1 (= {world_size // others} here) or change the degrees"
                   if world_size % others == 0 else
                   f"change the degrees: dp_replicate x tp x pp x cp = {others} does not divide {world_size}, "
                   "so dp_shard_degree -1 cannot fill it either")
            cp = f" x cp {self.cp_degree}" if self.cp_degree != 1 else ""
            raise ValueError(
                f"parallel: degrees multiply to {shard * others} (dp_replicate {self.dp_replicate_degree} x "
                f"dp_shard {shard} x tp {self.tp_degree} x pp {self.pp_degree}{cp}) but the world size is "
                f"{world_size}; {fix}")
        ep, cp = self.ep_degree, self.cp_degree
        if ep > 1 and ((shard * cp) % ep or ep % cp):
            raise ValueError(
                f"parallel.ep_degree: {ep} must divide dp_shard x cp = {shard} x {cp} = {shard * cp} and be a "
                f"multiple of cp_degree {cp} (expert parallelism borrows its ranks from dp_shard x cp); "
                f"use one of {[e for e in range(cp, shard * cp + 1, cp) if (shard * cp) % e == 0]}")
        return ParallelDegrees(pp=self.pp_degree, dp_replicate=self.dp_replicate_degree, dp_shard=shard,
                               tp=self.tp_degree, cp=cp, ep=ep)

    def degrees(self) -> ParallelDegrees:
        """Degrees of an already-resolved config (dp_shard_degree set)."""
        if self.dp_shard_degree == -1:
            raise ValueError("parallel.dp_shard_degree is -1: call resolve(world_size) or load_plan(..., "
                             "world_size=N) first")
        return self.resolve(self.dp_shard_degree * self.dp_replicate_degree * self.tp_degree * self.pp_degree
                            * self.cp_degree)


@dataclass
class Plan:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)

    SECTIONS = ("model", "data", "optimizer", "schedule", "training", "logging", "parallel", "checkpoint",
                "compile", "memory")


__all__ = [
    "Plan", "ModelConfig", "DataConfig", "OptimizerConfig", "ScheduleConfig", "TrainingConfig",
    "LoggingConfig", "CheckpointConfig", "CompileConfig", "ParallelConfig", "FSDPConfig", "TPConfig", "PPConfig",
    "ACConfig", "CPConfig", "ParallelDegrees", "MemoryConfig", "SwapConfig", "ActivationSwapConfig",
    "MULTI_STAGE_SCHEDULES", "V_SHAPED_SCHEDULES",
]
