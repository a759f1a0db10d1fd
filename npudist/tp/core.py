"""Tensor parallelism: ``apply_tp`` maps a plan's module-name patterns to PyTorch's ``ParallelStyle``s and
calls ``parallelize_module`` once (no reimplementation of sharding).

Plan styles and the layouts they get (``seq`` is ``Shard(1)`` with sequence parallelism, else ``Replicate``):

* ``colwise``   ``ColwiseParallel()``; on the model's output head: input ``seq``, output ``Replicate`` (or
                the vocab-sharded ``Shard(-1)`` DTensor with ``loss_parallel``).
* ``rowwise``   ``RowwiseParallel(output_layouts=seq)``; on an ``nn.Embedding`` the token ids come in
                replicated.
* ``sequence_parallel``  ``SequenceParallel()`` (norms between blocks).
* ``prepare_input``      ``PrepareModuleInput``: first positional input from ``Shard(1)`` to ``Replicate``
                (gather the sequence before attention / MLP).

With no pattern plan, the model's built-in plan (``build_llama_tp_plan``) is used.
"""
from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)

from npudist.models.tp_plan import build_llama_tp_plan, check_tp_divisibility
from npudist.plan.patterns import matches

HEAD_NAME = "output"  # the module whose output is the model's output (logits)


def _style(style: str, name: str, module: nn.Module, sequence_parallel: bool,
           loss_parallel: bool) -> ParallelStyle:
    seq = Shard(1) if sequence_parallel else Replicate()
    if style == "colwise":
        if name == HEAD_NAME:
            return ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                   use_local_output=not loss_parallel)
        return ColwiseParallel()
    if style == "rowwise":
        if isinstance(module, nn.Embedding):
            return RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
        return RowwiseParallel(output_layouts=seq)
    if style == "sequence_parallel":
        return SequenceParallel()
    if style == "prepare_input":
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    raise ValueError(f"parallel.tp.plan: unknown style {style!r}; use colwise, rowwise, sequence_parallel "
                     "or prepare_input")


def resolve_tp_plan(model: nn.Module, tp_cfg) -> dict[str, ParallelStyle]:
    """FQN -> ParallelStyle for this model (or pipeline stage) under ``tp_cfg``."""
    if tp_cfg.plan is None:
        return build_llama_tp_plan(model, tp_cfg.sequence_parallel, tp_cfg.loss_parallel)
    names = [n for n, _ in model.named_modules() if n]
    modules = dict(model.named_modules())
    plan: dict[str, ParallelStyle] = {}
    for pattern, style in tp_cfg.plan.items():
        hits = [n for n in names if matches(pattern, n)]
        # A pattern may legitimately miss on a pipeline stage that lacks those layers, but a pattern that
        # matches nothing on the *whole* model is a typo; the plan validator reports that before launch.
        for name in hits:
            if name in plan:
                raise ValueError(f"parallel.tp.plan: module {name!r} matched by more than one pattern "
                                 f"(last: {pattern!r}); make the patterns disjoint")
            plan[name] = _style(style, name, modules[name], tp_cfg.sequence_parallel, tp_cfg.loss_parallel)
    return plan


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, tp_cfg) -> nn.Module:
    """Shard ``model`` in place over the 1-D ``tp_mesh`` according to ``tp_cfg`` (a ``TPConfig``)."""
    if tp_mesh.ndim != 1:
        raise ValueError(f"apply_tp needs a 1-D tensor-parallel mesh, got {tp_mesh.ndim}-D {tp_mesh}")
    if hasattr(model, "args"):
        check_tp_divisibility(model.args, tp_mesh.size())
    tied = (getattr(model, "output", None) is not None and getattr(model, "tok_embeddings", None) is not None
            and model.output.weight is model.tok_embeddings.weight)
    parallelize_module(model, tp_mesh, resolve_tp_plan(model, tp_cfg))
    if tied:
        # parallelize_module distributes each module's parameters separately, which unties them. Both
        # styles shard the [vocab, dim] weight as Shard(0), so the embedding's DTensor serves both again.
        if model.output.weight.placements != model.tok_embeddings.weight.placements:
            raise ValueError("tied embeddings need the same TP sharding on tok_embeddings (rowwise) and "
                             "output (colwise); set model.tie_embeddings: false or fix parallel.tp.plan")
        model.output.weight = model.tok_embeddings.weight
    return model
