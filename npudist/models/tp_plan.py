"""The Llama decoder's built-in tensor-parallel plan (Megatron-style, as in torchtitan).

Attention q/k/v and the SwiGLU w1/w3 are split column-wise (by heads / hidden units), ``wo`` and ``w2``
row-wise, so each block needs one all-reduce (or, with sequence parallelism, one all-gather + one
reduce-scatter) in forward and one in backward. With sequence parallelism the norms and the residual stream
hold a sequence shard ``Shard(1)`` between blocks. With loss parallelism the logits stay sharded over the
vocabulary ``Shard(-1)`` and the loss must be computed inside ``torch.distributed.tensor.parallel.loss_parallel``.

The MoE decoder's plan (``build_moe_tp_plan``, as torchtitan's MoE TP with experts not split by tp) keeps
the Llama plan for attention, norms, embedding, head and the dense blocks. In an MoE block the shared expert
is split like the SwiGLU (w1/w3 column-wise, w2 row-wise into the sequence shard); the router gate and the
routed experts are replicated over tp, and each tp rank routes only its own 1/tp of every sequence
(``MoETokenParallel``: the sequence shard under sequence parallelism, else a chunk cut out of the replicated
sequence and all-gathered back): the expert all-to-all runs within the ep group of the rank's tp
coordinate, nothing is computed twice, and the gradients of the gate and the experts are summed over tp in
backward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel)


def build_llama_tp_plan(model: nn.Module, sequence_parallel: bool = True,
                        loss_parallel: bool = False) -> dict[str, ParallelStyle]:
    """FQN -> style for every module of ``model`` that exists on this rank (a pipeline stage may lack
    the embedding, the final norm or the output projection)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if sequence_parallel and getattr(model, "norm", None) is not None:
        plan["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=seq, output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel)
    for name in model.layers:
        prefix = f"layers.{name}."
        block = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        }
        if sequence_parallel:
            block.update({
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                # Gather the sequence shard of x (the rotary tables arrive as keyword arguments).
                "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                   desired_input_layouts=(Replicate(),)),
            })
        plan.update({prefix + k: v for k, v in block.items()})
    return plan


class MoETokenParallel(ParallelStyle):
    """For an ``npudist.models.moe.MoE``: each tp rank routes only its own share of the tokens. With sequence
    parallelism that is the sequence shard the layer receives (a ``Shard(1)`` DTensor from the
    SequenceParallel norm, or its local tensor), and the layer returns this rank's shard. Without it the
    layer receives the whole sequence on every tp rank, routes the rank's 1/tp of the sequence and
    all-gathers the routed result (``SequenceSplit``). The router and the experts are the same on every tp
    rank, so their gradients are summed over tp; the sequence-wise balance loss adds its statistics up over
    the tp group (as over cp) and each tp rank backpropagates 1/tp of it."""

    def __init__(self, sequence_parallel: bool = True):
        super().__init__()
        self.sequence_parallel = sequence_parallel

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group, size = device_mesh.get_group(), device_mesh.size()
        module.token_group = module.seq_group = group
        module.aux_grad_scale = 1.0 / size
        module.experts.grad_sum_group = group
        if self.sequence_parallel:
            module.register_forward_pre_hook(_local_sequence_shard)
        else:
            module.token_split = SequenceSplit(group, device_mesh.get_local_rank(), size)
        return module


def _local_sequence_shard(module, args):
    (x, *rest) = args
    if isinstance(x, DTensor):
        if tuple(x.placements) != (Shard(1),):
            raise ValueError(f"the MoE layer under tensor parallelism takes a sequence shard Shard(1), got "
                             f"{x.placements}")
        x = x.to_local()
    return (x, *rest)


class SequenceSplit:
    """This tp rank's chunk of a sequence every tp rank holds whole, and back. ``scatter``'s backward
    all-gathers the chunks' gradients (every rank needs the whole gradient of its replicated input);
    ``gather``'s backward keeps the rank's chunk of the gradient (identical on every rank)."""

    def __init__(self, group, rank: int, size: int):
        self.group, self.rank, self.size = group, rank, size

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] % self.size:
            raise ValueError(f"data.seq_len: {x.shape[1]} tokens per sequence cannot be split over "
                             f"parallel.tp_degree={self.size} (the MoE layers route 1/tp of every sequence per tp "
                             "rank); use a multiple of tp_degree")
        return _ScatterSequence.apply(x, self)

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        return _GatherSequence.apply(y, self)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        out = t.new_empty(self.size, *t.shape)
        dist.all_gather_into_tensor(out, t.contiguous(), group=self.group)
        return torch.cat(out.unbind(0), dim=1)


class _ScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, split: SequenceSplit):
        ctx.split = split
        return x.chunk(split.size, dim=1)[split.rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return ctx.split.all_gather(grad), None


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, split: SequenceSplit):
        ctx.split = split
        return split.all_gather(y)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.split.size, dim=1)[ctx.split.rank].contiguous(), None


def build_moe_tp_plan(model: nn.Module, sequence_parallel: bool = True,
                      loss_parallel: bool = False) -> dict[str, ParallelStyle]:
    """The Llama plan for everything but the MoE blocks' feed-forward, which gets ``MoETokenParallel`` and a
    column/row split shared expert."""
    plan = build_llama_tp_plan(model, sequence_parallel, loss_parallel)
    seq = Shard(1) if sequence_parallel else Replicate()
    for name, block in model.layers.items():
        if getattr(block, "moe", None) is None:
            continue
        prefix = f"layers.{name}."
        for key in [k for k in plan if k.startswith(prefix + "feed_forward")]:
            del plan[key]
        plan[prefix + "moe"] = MoETokenParallel(sequence_parallel)
        if block.moe.shared_expert is not None:
            plan.update({
                prefix + "moe.shared_expert.w1": ColwiseParallel(),
                prefix + "moe.shared_expert.w3": ColwiseParallel(),
                prefix + "moe.shared_expert.w2": RowwiseParallel(output_layouts=seq),
            })
            if sequence_parallel:
                plan[prefix + "moe.shared_expert"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                                        desired_input_layouts=(Replicate(),))
    return plan
