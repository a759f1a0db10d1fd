"""FSDP2 (``fully_shard``) and activation checkpointing, applied the torchtitan way.

``apply_fsdp`` wraps each module matching ``fsdp_cfg.wrap`` (default: the model spec's units, the
transformer blocks of the built-in models) as its own FSDP unit, then the root, so parameters are
all-gathered one block at a time and the root unit holds the rest (embeddings, final norm, output).
Modules sharing a parameter (tied weights) are left to the root. Over a 2-D data-parallel mesh
(dp_replicate, dp_shard) this is HSDP; over a 1-D replicate-only mesh it is FSDP2's ``replicate``. Tensor-parallel DTensor parameters compose
(2-D FSDP x TP) as long as both meshes are slices of the same root mesh.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from npudist.plan.patterns import matches

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _wrap_targets(model: nn.Module, patterns: list[str]) -> list[tuple[str, nn.Module]]:
    """Matching modules, outermost first; a module inside an already chosen one is skipped because FSDP
    units must nest from the leaves up (children are wrapped before parents below)."""
    out = []
    for name, module in model.named_modules():
        if name and any(matches(p, name) for p in patterns):
            if not any(name.startswith(prev + ".") for prev, _ in out):
                out.append((name, module))
    return out


def _drop_shared(targets: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Targets minus those holding a parameter another target also holds (tied weights): a shared
    parameter must live in one FSDP unit, so its users are left to the root."""
    count: dict[int, int] = {}
    for _, module in targets:
        for p in {id(p) for p in module.parameters()}:
            count[p] = count.get(p, 0) + 1
    return [(n, m) for n, m in targets if all(count[id(p)] == 1 for p in m.parameters())]


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, fsdp_cfg, reshard_after_forward: bool | None = None,
               units: list[str] = (), ignored: set[nn.Parameter] | None = None) -> nn.Module:
    """Shard (or replicate) ``model`` in place over ``dp_mesh`` per ``fsdp_cfg`` (an ``FSDPConfig``).
    ``units``: module-name patterns used when ``fsdp_cfg.wrap`` is None (the model spec's FSDP units).
    ``ignored``: parameters FSDP must not manage (expert-parallel experts, sharded over their own mesh).

    ``reshard_after_forward`` overrides the config; pipeline parallelism passes False because each stage
    runs several micro-batch forwards per step, which would otherwise all-gather the same weights again.
    """
    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[fsdp_cfg.param_dtype],
                              reduce_dtype=_DTYPES[fsdp_cfg.reduce_dtype])
    offload = CPUOffloadPolicy() if fsdp_cfg.cpu_offload else OffloadPolicy()
    reshard = fsdp_cfg.reshard_after_forward if reshard_after_forward is None else reshard_after_forward
    names = dp_mesh.mesh_dim_names or ()
    replicate_only = dp_mesh.ndim == 1 and names == ("dp_replicate",)
    targets = _drop_shared(_wrap_targets(model, fsdp_cfg.wrap if fsdp_cfg.wrap is not None else list(units)))
    extra = {"ignored_params": set(ignored)} if ignored else {}
    for _, module in reversed(targets):
        if replicate_only:
            replicate(module, mesh=dp_mesh, mp_policy=mp, offload_policy=offload, **extra)
        else:
            fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp,
                        offload_policy=offload, **extra)
    if replicate_only:
        replicate(model, mesh=dp_mesh, mp_policy=mp, offload_policy=offload, **extra)
    else:
        # The root is needed for the backward all-reduce/reduce-scatter of whatever the units did not take.
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload,
                    **extra)
    return model


def _op_policy():
    """Selective op-level policy: keep matmul outputs (expensive), recompute everything else."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    save = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return lambda: create_selective_checkpoint_contexts(policy)


def _checkpoint(block: nn.Module, context_fn=None) -> None:
    if hasattr(block, "set_activation_checkpointing"):
        block.set_activation_checkpointing(context_fn)
    elif context_fn is None:
        checkpoint(block)   # composable: no wrapper module, names unchanged
    else:
        raise ValueError(f"{type(block).__name__} does not support selective (op) activation checkpointing; "
                         "use parallel.activation_checkpoint.mode full or selective_policy layer")


def apply_activation_checkpointing(model: nn.Module, ac_cfg, blocks: list[str]) -> nn.Module:
    """Recompute block activations in backward per ``ac_cfg`` (an ``ACConfig``): ``full`` every block,
    ``selective`` + ``layer`` every ``every_n_layers``-th block (by its index in ``blocks``, the whole
    model's block names, so a pipeline stage checkpoints the same blocks as the whole model), ``selective`` +
    ``op`` every block but keeping matmul and attention outputs. Blocks this stage lacks are skipped."""
    if ac_cfg.mode == "none":
        return model
    present = dict(model.named_modules())
    for index, name in enumerate(blocks):
        block = present.get(name)
        if block is None:
            continue
        if ac_cfg.mode == "full":
            _checkpoint(block)
        elif ac_cfg.selective_policy == "layer":
            if index % ac_cfg.every_n_layers == 0:
                _checkpoint(block)
        else:
            _checkpoint(block, _op_policy())
    return model
