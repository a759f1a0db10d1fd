"""Model specs: everything the parallel wrappers and the plan checker need to know about a model, by name.

A ``ModelSpec`` (torchtitan's TrainSpec is the model) bundles

* ``build(model_cfg) -> nn.Module``: the model on the current default device, initialised from the seed;
* ``layout(model_cfg) -> ModelLayout``: module names, parameter shapes, the repeated blocks (pipeline split
  points and FSDP units), the modules only the first / last pipeline stage runs, the output head, tied
  weights and, for transformer-shaped models, the widths the activation estimate needs;
* ``tp_plan(model, layout, tp_cfg) -> {fqn: ParallelStyle}``: the built-in tensor-parallel plan (None: the
  plan must list ``parallel.tp.plan`` patterns);
* ``check(model_cfg, parallel_cfg) -> ["key.path: problem", ...]``: the model's shape rules (for the plan's
  tensor-parallel degree) and what it cannot do;
* ``fsdp_units``: the default ``parallel.fsdp.wrap`` patterns;
* ``supports_pipeline``: whether ``forward`` runs with the first/last-stage modules set to None;
* ``supports_context_parallel``: whether the model runs on a sequence shard (``npudist.cp``);
* ``experts(model_cfg) -> int``: the number of routed experts per MoE layer (None or 0: a dense model), which
  ``parallel.ep_degree`` splits (``npudist.ep``);
* ``expert_parallel(model) -> [(name, experts module)]``: readies the model's own grouped-experts modules
  for ``npudist.ep.apply_ep``, which shards their ``[n_experts, ...]`` weights over ep and gives each a
  dispatcher (``npudist_dispatch``) and gradient factor (``npudist_grad_scale``) that their forward uses
  (None: the ``npudist.models.moe`` layers);
* ``describe_tp(tp_degree, seq_len) -> [line, ...]``: what the built-in tensor-parallel plan does beyond
  splitting weights, for ``npudist plan check`` (None: nothing to add);
* ``variant(model_cfg) -> str``: which model of the spec the plan's ``model`` section selects, when the
  spec's name does not say it (``hf_causal_lm``: the transformers model type; ``module``: the entry point),
  for ``npudist plan check`` (None: the name says it all);
* ``config_cls``: the dataclass of the plan's ``model`` section for this spec (None: ``ModelConfig``); a
  spec with fields of its own (``moe``: n_experts, top_k, ...) subclasses ``ModelConfig``.

The plan layer, ``npudist.fsdp``/``tp``/``pp`` and ``npudist.mesh`` know a model only through this
interface; they name no model attribute. This module is torch-free (the plan checker imports it); a spec's
functions import torch (and the model's own packages) only when called.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

MODEL_NAME_KEY = "model.name"


@dataclass(frozen=True)
class TransformerDims:
    """Widths of a decoder block, per token: what the activation estimate of ``npudist plan check`` uses."""
    dim: int               # residual stream
    q_width: int           # n_heads * head_dim
    kv_width: int          # n_kv_heads * head_dim
    ffn_hidden: int
    vocab_size: int


@dataclass(frozen=True)
class ModelLayout:
    """A model's structure by fully qualified names, computed without (or from a meta-device) model."""
    modules: tuple[str, ...]                      # every sub-module, as named_modules() lists them (no root)
    params: dict[str, tuple[int, ...]]            # parameter -> shape; a tied weight is listed once
    blocks: tuple[str, ...] = ()                  # the repeated blocks in forward order (pipeline units)
    first: tuple[str, ...] = ()                   # modules only the first pipeline stage runs (embedding)
    last: tuple[str, ...] = ()                    # modules only the last pipeline stage runs (norm, head)
    head: str | None = None                       # the module producing the logits
    tied: tuple[tuple[str, str], ...] = ()        # (owner module, module sharing owner's weight)
    tp_sharded: tuple[str, ...] = ()              # patterns of the modules the built-in TP plan splits
    experts: tuple[str, ...] = ()                 # modules of routed experts (split by parallel.ep_degree)
    dims: TransformerDims | None = None           # None: no activation estimate

    def block_index(self, module: str) -> int | None:
        """Index of the block that contains ``module`` (or is it), else None."""
        for i, block in enumerate(self.blocks):
            if module == block or module.startswith(block + "."):
                return i
        return None


def _in(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def stage_of_module(layout: ModelLayout, module: str):
    """Where a module lives under pipelining: ("block", i), ("first",), ("last",) or ("every",)."""
    i = layout.block_index(module)
    if i is not None:
        return ("block", i)
    if _in(module, layout.first):
        return ("first",)
    if _in(module, layout.last):
        return ("last",)
    return ("every",)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable
    layout: Callable
    check: Callable = lambda cfg, parallel: []
    tp_plan: Callable | None = None
    fsdp_units: tuple[str, ...] = ()
    supports_pipeline: bool = False
    supports_context_parallel: bool = False
    experts: Callable | None = None
    expert_parallel: Callable | None = None
    config_cls: type | None = None
    describe_tp: Callable | None = None
    variant: Callable | None = None
    description: str = ""


_SPECS: dict[str, ModelSpec] = {}


def register_model_spec(spec: ModelSpec, *, replace: bool = False) -> ModelSpec:
    """Make ``spec`` available as ``model.name: <spec.name>`` in plans. A name registered twice is an
    error unless ``replace=True`` (so two plug-ins cannot silently shadow each other)."""
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"register_model_spec expects a ModelSpec, got {type(spec).__name__}")
    if not spec.name or not isinstance(spec.name, str):
        raise ValueError("a model spec needs a non-empty name")
    if spec.name in _SPECS and not replace:
        raise ValueError(f"model spec {spec.name!r} is already registered; pass replace=True to override it")
    _SPECS[spec.name] = spec
    _LAYOUTS.clear()
    return spec


def model_spec_names() -> list[str]:
    return sorted(_SPECS)


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered as ``name``; ValueError naming the registered ones otherwise."""
    spec = _SPECS.get(name)
    if spec is None:
        import difflib
        close = difflib.get_close_matches(str(name), list(_SPECS), n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        raise ValueError(f"{MODEL_NAME_KEY}: {name!r} is not a registered model spec{hint}; registered: "
                         f"{', '.join(model_spec_names())} (add one with npudist.models.register_model_spec)")
    return spec


_LAYOUTS: dict[str, ModelLayout] = {}


def model_layout(cfg) -> ModelLayout:
    """The layout of the model ``cfg`` (a ``ModelConfig``) describes, cached: plan check asks once per rank
    and a meta-device build of a HuggingFace or user model is not free."""
    key = repr(dataclasses.astuple(cfg)) if dataclasses.is_dataclass(cfg) else repr(cfg)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = get_model_spec(cfg.name).layout(cfg)
    return _LAYOUTS[key]


def build_model(cfg):
    """The model a plan's ``model`` section describes, built by its spec on the current default device."""
    return get_model_spec(cfg.name).build(cfg)


def layout_from_module(model, blocks: tuple[str, ...] = (), first: tuple[str, ...] = (),
                       last: tuple[str, ...] = (), head: str | None = None, tp_sharded: tuple[str, ...] = (),
                       dims: TransformerDims | None = None) -> ModelLayout:
    """Layout read off a built (typically meta-device) module: names, shapes and tied weights."""
    owner: dict[int, str] = {}
    params: dict[str, tuple[int, ...]] = {}
    tied: list[tuple[str, str]] = []
    for name, p in model.named_parameters(remove_duplicate=False):
        module = name.rpartition(".")[0]
        if id(p) in owner:
            tied.append((owner[id(p)].rpartition(".")[0], module))
            continue
        owner[id(p)] = name
        params[name] = tuple(p.shape)
    return ModelLayout(modules=tuple(n for n, _ in model.named_modules() if n), params=params,
                       blocks=tuple(blocks), first=tuple(first), last=tuple(last), head=head,
                       tied=tuple(tied), tp_sharded=tuple(tp_sharded), dims=dims)


__all__ = ["ModelLayout", "ModelSpec", "TransformerDims", "build_model", "get_model_spec", "layout_from_module",
           "model_layout", "model_spec_names", "register_model_spec", "stage_of_module"]
