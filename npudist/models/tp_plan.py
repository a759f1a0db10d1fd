"""The Llama decoder's built-in tensor-parallel plan (Megatron-style, as in torchtitan).

Attention q/k/v and the SwiGLU w1/w3 are split column-wise (by heads / hidden units), ``wo`` and ``w2``
row-wise, so each block needs one all-reduce (or, with sequence parallelism, one all-gather + one
reduce-scatter) in forward and one in backward. With sequence parallelism the norms and the residual stream
hold a sequence shard ``Shard(1)`` between blocks. With loss parallelism the logits stay sharded over the
vocabulary ``Shard(-1)`` and the loss must be computed inside ``torch.distributed.tensor.parallel.loss_parallel``.

The MoE decoder's plan (``build_moe_tp_plan``, as torchtitan's MoE TP with experts not split by tp) keeps
the Llama plan for attention, norms, embedding, head and the dense blocks. In an MoE block the shared expert
is split like the SwiGLU (w1/w3 column-wise, w2 row-wise into the sequence shard); the router gate and the
routed experts are replicated over tp, and each tp rank routes only the tokens of its own sequence shard
(``MoETokenParallel``): the expert all-to-all runs within the ep group of the rank's tp coordinate, nothing
is computed twice, and the gradients of the gate and the experts are summed over tp in backward.
"""
from __future__ import annotations

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
    """For an ``npudist.models.moe.MoE`` under sequence parallelism: the layer takes its input as the local
    sequence shard (a ``Shard(1)`` DTensor from the SequenceParallel norm, or its local tensor) and returns
    this rank's shard, routing only its own tokens. The router and the experts are the same on every tp rank,
    so their gradients are summed over tp; the sequence-wise balance loss adds its statistics up over the tp
    group (as over cp) and each tp rank backpropagates 1/tp of it."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group, size = device_mesh.get_group(), device_mesh.size()
        module.token_group = module.seq_group = group
        module.aux_grad_scale = 1.0 / size
        module.experts.grad_sum_group = group
        module.register_forward_pre_hook(_local_sequence_shard)
        return module


def _local_sequence_shard(module, args):
    (x, *rest) = args
    if isinstance(x, DTensor):
        if tuple(x.placements) != (Shard(1),):
            raise ValueError(f"the MoE layer under tensor parallelism takes a sequence shard Shard(1), got "
                             f"{x.placements}")
        x = x.to_local()
    return (x, *rest)


def build_moe_tp_plan(model: nn.Module, sequence_parallel: bool = True,
                      loss_parallel: bool = False) -> dict[str, ParallelStyle]:
    """The Llama plan for everything but the MoE blocks' feed-forward, which gets ``MoETokenParallel`` and a
    column/row split shared expert. Needs sequence parallelism (the moe spec's check says so)."""
    if not sequence_parallel:
        raise ValueError("parallel.tp.sequence_parallel: the moe model's TP plan routes each tp rank's sequence "
                         "shard; set it to true")
    plan = build_llama_tp_plan(model, sequence_parallel, loss_parallel)
    for name, block in model.layers.items():
        if getattr(block, "moe", None) is None:
            continue
        prefix = f"layers.{name}."
        for key in [k for k in plan if k.startswith(prefix + "feed_forward")]:
            del plan[key]
        plan[prefix + "moe"] = MoETokenParallel()
        if block.moe.shared_expert is not None:
            plan.update({
                prefix + "moe.shared_expert": PrepareModuleInput(input_layouts=(Shard(1),),
                                                                 desired_input_layouts=(Replicate(),)),
                prefix + "moe.shared_expert.w1": ColwiseParallel(),
                prefix + "moe.shared_expert.w3": ColwiseParallel(),
                prefix + "moe.shared_expert.w2": RowwiseParallel(output_layouts=Shard(1)),
            })
    return plan
