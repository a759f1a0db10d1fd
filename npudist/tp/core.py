"""Tensor parallelism: ``apply_tp`` maps a plan's module-name patterns to PyTorch's ``ParallelStyle``s and
calls ``parallelize_module`` once (no reimplementation of sharding).

Plan styles and the layouts they get (``seq`` is ``Shard(1)`` with sequence parallelism, else ``Replicate``):

* ``colwise``   ``ColwiseParallel()``; on the model's output head (``head``, from the model spec): input
                ``seq``, output ``Replicate`` (or the vocab-sharded ``Shard(-1)`` DTensor with
                ``loss_parallel``).
* ``rowwise``   ``RowwiseParallel(output_layouts=seq)``; on an ``nn.Embedding`` the token ids come in
                replicated.
* ``sequence_parallel``  ``SequenceParallel()`` (norms between blocks).
* ``prepare_input``      ``PrepareModuleInput``: first positional input from ``Shard(1)`` to ``Replicate``
                (gather the sequence before attention / MLP).

With no pattern plan, the model spec's built-in plan is used: either pattern -> style like a plan's, or
a function returning FQN -> ParallelStyle. Weights tied across modules are re-tied after sharding. With
``async_tp`` the sequence-parallel linear pairs run on the MC2 operators (npudist.tp.async_tp).
"""
from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)

from npudist.plan.patterns import matches
from npudist.tp.async_tp import async_plan


def _style(style: str, name: str, module: nn.Module, sequence_parallel: bool,
           loss_parallel: bool, head: str | None) -> ParallelStyle:
    seq = Shard(1) if sequence_parallel else Replicate()
    if style == "colwise":
        if name == head:
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


def resolve_tp_plan(model: nn.Module, tp_cfg, builtin=None, head: str | None = None) -> dict[str, ParallelStyle]:
    """FQN -> ParallelStyle for this model (or pipeline stage) under ``tp_cfg``. ``builtin`` is the model's
    own plan for ``tp_cfg.plan`` None: a pattern -> style mapping, or ``builtin(model, tp_cfg)``."""
    patterns = tp_cfg.plan
    if patterns is None:
        if builtin is None:
            raise ValueError("parallel.tp.plan: this model has no built-in tensor-parallel plan; list module "
                             "patterns and styles")
        if callable(builtin):
            return builtin(model, tp_cfg)
        patterns = builtin
    names = [n for n, _ in model.named_modules() if n]
    modules = dict(model.named_modules())
    plan: dict[str, ParallelStyle] = {}
    for pattern, style in patterns.items():
        hits = [n for n in names if matches(pattern, n)]
        # A pattern may legitimately miss on a pipeline stage that lacks those layers, but a pattern that
        # matches nothing on the *whole* model is a typo; the plan validator reports that before launch.
        for name in hits:
            if name in plan:
                raise ValueError(f"parallel.tp.plan: module {name!r} matched by more than one pattern "
                                 f"(last: {pattern!r}); make the patterns disjoint")
            plan[name] = _style(style, name, modules[name], tp_cfg.sequence_parallel, tp_cfg.loss_parallel, head)
    return plan


def _tied_pairs(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
    """(owner, name, user, name) for every parameter registered on two modules."""
    owners, pairs = {}, []
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in owners:
                pairs.append((*owners[id(p)], module, pname))
            else:
                owners[id(p)] = (module, pname)
    return pairs


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, tp_cfg, builtin=None, head: str | None = None) -> nn.Module:
    """Shard ``model`` in place over the 1-D ``tp_mesh`` according to ``tp_cfg`` (a ``TPConfig``);
    ``builtin`` and ``head`` as in ``resolve_tp_plan``."""
    if tp_mesh.ndim != 1:
        raise ValueError(f"apply_tp needs a 1-D tensor-parallel mesh, got {tp_mesh.ndim}-D {tp_mesh}")
    tied = _tied_pairs(model)
    plan = resolve_tp_plan(model, tp_cfg, builtin, head)
    if getattr(tp_cfg, "async_tp", False):
        plan = async_plan(model, plan)
    parallelize_module(model, tp_mesh, plan)
    for owner, oname, user, uname in tied:
        # parallelize_module distributes each module's parameters separately, which unties them. Tied
        # weights need the same sharding on both modules (rowwise embedding, colwise head: both Shard(0)).
        kept, other = getattr(owner, oname), getattr(user, uname)
        if getattr(kept, "placements", None) != getattr(other, "placements", None):
            raise ValueError("a tied weight needs the same TP sharding on both modules that use it (rowwise "
                             "embedding, colwise head); set model.tie_embeddings: false or fix parallel.tp.plan")
        setattr(user, uname, kept)
    return model
