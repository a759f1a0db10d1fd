"""Spec ``module``: the user's own ``nn.Module``, named in the plan by a Python entry point.

    model:
      name: module
      module: my_pkg.my_mod:build_model    # called as build_model(model_cfg) -> nn.Module
      vocab_size: 256                      # the plan's model fields reach the builder unchanged

The module maps token ids [bs, seq] to logits [bs, seq, vocab_size]. FSDP units come from
``parallel.fsdp.wrap`` patterns (default: the root only), tensor parallelism from ``parallel.tp.plan``
patterns (there is no built-in plan). Pipeline parallelism needs to know the blocks and the first/last-stage
modules: register a full ``ModelSpec`` with ``npudist.models.register_model_spec`` for that.
"""
from __future__ import annotations

import importlib

from .spec import ModelSpec, layout_from_module


def resolve_entry_point(path: str):
    """The callable ``"package.module:function"`` names; ValueError saying what is wrong otherwise."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ValueError(f"model.module: expected \"package.module:function\", got {path!r}")
    mod_name, attr = path.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(f"model.module: cannot import {mod_name!r} ({e}); is it on PYTHONPATH?") from e
    fn = mod
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"model.module: {mod_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"model.module: {path} is not callable")
    return fn


def check_module(cfg, parallel) -> list[str]:
    errors = []
    if not cfg.module:
        return ['model.module: model.name module needs model.module: "package.module:function"']
    try:
        resolve_entry_point(cfg.module)
    except ValueError as e:
        errors.append(str(e))
    if parallel.tp_degree > 1 and parallel.tp.plan is None:
        errors.append("parallel.tp.plan: a user module has no built-in tensor-parallel plan; list module "
                      "patterns and styles")
    return errors


def build_module(cfg):
    from torch import nn
    model = resolve_entry_point(cfg.module)(cfg)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model.module: {cfg.module} returned {type(model).__name__}, not an nn.Module")
    return model


def module_layout(cfg):
    import torch
    with torch.device("meta"):
        model = build_module(cfg)
    return layout_from_module(model)


def module_variant(cfg) -> str:
    return cfg.module


MODULE_SPEC = ModelSpec(name="module", build=build_module, layout=module_layout, check=check_module,
                        variant=module_variant,
                        description="the user's own nn.Module from model.module (package.module:function)")
