"""Graph mode from a plan's ``compile`` section, the torchtitan way: each block compiled on its own, then the loss.

``apply_compile`` runs inside ``npudist.parallelize`` after tensor parallelism and activation checkpointing and
before FSDP, on every pipeline stage:

* after TP, so Dynamo traces the block's DTensor ops and their functional collectives (which run on hccl) into
  the graph -- ``fullgraph=True`` turns any graph break into an error instead of a silent slowdown;
* after AC in torchtitan's order -- but blocks under activation checkpointing are rejected by plan validation
  for now: recomputing a seeded op (SDPA) needs torch's RNG-state operators, which have no npu kernel
  (reason in ``npudist/plan/validate.py``);
* before FSDP, and by compiling the block's ``forward`` rather than wrapping the block: FSDP2's all-gather /
  reduce-scatter hooks and pipelining's stage boundaries stay outside the compiled regions, and parameter
  names (checkpoints, optimizer state, parity tests) stay those of the eager model (torchtitan's
  ``torch.compile(block)`` wrapper would add ``_orig_mod.`` to every name).

Blocks are the model spec's ``blocks`` (the repeated transformer layers); every block runs the same code, so the
blocks share one compiled graph.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn


def _compile(fn: Callable, compile_cfg) -> Callable:
    return torch.compile(fn, backend=compile_cfg.backend, fullgraph=True)


def _settle(value):
    """A plain tensor for an ``AsyncCollectiveTensor`` (the result of an asynchronous functional collective,
    e.g. the embedding's all-reduce under TP, handed on by ``to_local()``); anything else unchanged.

    Measured on torch 2.13: when such a tensor enters a compiled region as an input, AOTAutograd returns no
    gradient for it, so the eager ``to_local`` backward receives None and the redistribution before it fails
    ("'Tensor' object has no attribute '_local_tensor'"). ``clone`` waits for the collective and keeps the
    autograd edge (a view op would keep the lazy wrapper); it costs one copy of that activation."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return value.clone() if isinstance(value, AsyncCollectiveTensor) else value


def _compile_forward(forward: Callable, compile_cfg) -> Callable:
    compiled = _compile(forward, compile_cfg)

    @functools.wraps(forward)
    def run(*args, **kwargs):
        return compiled(*map(_settle, args), **{k: _settle(v) for k, v in kwargs.items()})

    return run


def apply_compile(model: nn.Module, compile_cfg, blocks: list[str]) -> list[str]:
    """Compile the forward of each module of ``model`` named in ``blocks`` (the whole model's block names; a
    pipeline stage compiles the ones it holds) when ``compile_cfg`` (a ``CompileConfig``) enables the ``model``
    component. Returns the names compiled."""
    if not compile_cfg.enable or "model" not in compile_cfg.components:
        return []
    present = dict(model.named_modules())
    done = []
    for name in blocks:
        block = present.get(name)
        if block is None:
            continue
        if "forward" in vars(block):
            raise ValueError(f"{name}: its forward is already replaced on the instance (compiled twice?); "
                             "apply compile once per model")
        block.forward = _compile_forward(block.forward, compile_cfg)
        done.append(name)
    return done


def compile_loss(loss_fn: Callable, compile_cfg) -> Callable:
    """``loss_fn`` compiled when ``compile_cfg`` enables the ``loss`` component, else ``loss_fn`` itself."""
    if not compile_cfg.enable or "loss" not in compile_cfg.components:
        return loss_fn
    return _compile(loss_fn, compile_cfg)


def describe_compiled(compiled: list[str], compile_cfg) -> str:
    """One log line: what graph mode compiles and how many graphs Dynamo has captured so far in this process."""
    import torch._dynamo.utils   # imported by torch.compile already when anything was compiled

    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return (f"graph mode ({compile_cfg.backend}, fullgraph): {', '.join(compiled)}; {graphs} graph(s) captured "
            "in this process")
