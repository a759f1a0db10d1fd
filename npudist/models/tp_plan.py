"""The Llama decoder's built-in tensor-parallel plan (Megatron-style, as in torchtitan).

Attention q/k/v and the SwiGLU w1/w3 are split column-wise (by heads / hidden units), ``wo`` and ``w2``
row-wise, so each block needs one all-reduce (or, with sequence parallelism, one all-gather + one
reduce-scatter) in forward and one in backward. With sequence parallelism the norms and the residual stream
hold a sequence shard ``Shard(1)`` between blocks. With loss parallelism the logits stay sharded over the
vocabulary ``Shard(-1)`` and the loss must be computed inside ``torch.distributed.tensor.parallel.loss_parallel``.
"""
from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
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
