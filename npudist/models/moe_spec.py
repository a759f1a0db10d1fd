"""Spec ``moe``: a small mixture-of-experts decoder in the DeepSeek-V3 / Qwen3-MoE shape (``npudist.models.moe``),
with config fields of its own (``MoEConfig``). Torch-free: the plan checker imports it.

Layout: the Llama decoder's names, except that the feed-forward of block ``i >= n_dense_layers`` is
``layers.<i>.moe`` with ``router.gate``, grouped ``experts`` (weights ``w1``/``w2``/``w3`` of shape
``[n_experts, ...]``) and ``shared_expert.{w1,w2,w3}``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .config import ModelConfig
from .llama_spec import BUILTIN_TP_SHARDED, module_names, param_shapes, transformer_dims
from .rules import check_transformer
from .spec import ModelLayout, ModelSpec


@dataclass
class MoEConfig(ModelConfig):
    """``model`` section of ``name: moe``: the Llama fields (``ffn_hidden_dim`` is the width of the dense
    blocks' SwiGLU) plus the mixture of experts."""
    name: str = "moe"
    n_experts: int = 8                     # routed experts per MoE block (split over parallel.ep_degree)
    top_k: int = 2                         # experts each token is sent to
    n_shared_experts: int = 1              # experts every token passes through (one SwiGLU this many times wide)
    moe_hidden_dim: int = 64               # SwiGLU hidden width of one expert
    n_dense_layers: int = 1                # the first blocks keep a dense feed-forward (as DeepSeek-V3)
    score_func: Literal["softmax", "sigmoid"] = "softmax"   # router scores: Qwen3-MoE softmax, DeepSeek-V3 sigmoid
    route_norm: bool = True                # renormalise the top-k scores of a token to sum to 1
    # Load balancing: DeepSeek-V3's sequence-wise auxiliary loss, coef * n_experts * sum_i f_i * P_i per
    # sequence (f_i: share of the sequence's routing slots taken by expert i, P_i: its mean score). Added to
    # the gradient, not to the logged loss. 0 = no balancing.
    aux_loss_coef: float = 0.01


def is_moe_block(cfg, i: int) -> bool:
    return i >= cfg.n_dense_layers


def moe_module_names(cfg) -> list[str]:
    names = []
    for name in module_names(cfg):
        parts = name.split(".")
        if len(parts) >= 3 and parts[0] == "layers" and parts[2] == "feed_forward" and is_moe_block(cfg, int(parts[1])):
            if len(parts) == 3:
                p = f"layers.{parts[1]}.moe"
                names += [p, f"{p}.router", f"{p}.router.gate", f"{p}.experts", f"{p}.shared_expert",
                          f"{p}.shared_expert.w1", f"{p}.shared_expert.w2", f"{p}.shared_expert.w3"]
            continue
        names.append(name)
    return names


def moe_param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    d, h, e = cfg.dim, cfg.moe_hidden_dim, cfg.n_experts
    hs = h * cfg.n_shared_experts
    shapes = {}
    for name, shape in param_shapes(cfg).items():
        parts = name.split(".")
        if parts[0] == "layers" and parts[2] == "feed_forward" and is_moe_block(cfg, int(parts[1])):
            if parts[3] == "w1":
                p = f"layers.{parts[1]}.moe"
                shapes[f"{p}.router.gate.weight"] = (e, d)
                shapes.update({f"{p}.experts.w1": (e, h, d), f"{p}.experts.w2": (e, d, h),
                               f"{p}.experts.w3": (e, h, d)})
                if hs:
                    shapes.update({f"{p}.shared_expert.w1.weight": (hs, d), f"{p}.shared_expert.w2.weight": (d, hs),
                                   f"{p}.shared_expert.w3.weight": (hs, d)})
            continue
        shapes[name] = shape
    return shapes


def moe_layout(cfg) -> ModelLayout:
    names = moe_module_names(cfg)
    if not cfg.n_shared_experts:
        names = [n for n in names if ".shared_expert" not in n]
    return ModelLayout(
        modules=tuple(names), params=moe_param_shapes(cfg),
        blocks=tuple(f"layers.{i}" for i in range(cfg.n_layers)), first=("tok_embeddings",),
        last=("norm", "output"), head="output",
        tied=(("tok_embeddings", "output"),) if cfg.tie_embeddings else (),
        experts=tuple(f"layers.{i}.moe.experts" for i in range(cfg.n_layers) if is_moe_block(cfg, i)),
        tp_sharded=MOE_TP_SHARDED, dims=moe_dims(cfg))


# Modules whose weight the built-in TP plan (npudist.models.tp_plan.build_moe_tp_plan) splits over tp: the
# Llama ones (the dense blocks' feed-forward included) and the MoE blocks' shared expert. The router gate and
# the routed experts are replicated over tp.
MOE_TP_SHARDED = BUILTIN_TP_SHARDED + ("layers.*.moe.shared_expert.w[123]",)


def moe_dims(cfg):
    """Widths for the activation estimate: a token's feed-forward activations in an MoE block are those of
    its top_k experts plus the shared expert (the dense blocks' ffn_hidden_dim when that is wider)."""
    import dataclasses
    routed = cfg.moe_hidden_dim * (cfg.top_k + cfg.n_shared_experts)
    return dataclasses.replace(transformer_dims(cfg), ffn_hidden=max(cfg.ffn_hidden_dim, routed))


def check_moe(cfg, parallel) -> list[str]:
    tp = parallel.tp_degree if parallel.tp_degree >= 1 else 1
    errors = check_transformer(cfg, tp)
    for name in ("n_experts", "top_k", "moe_hidden_dim"):
        if getattr(cfg, name) < 1:
            errors.append(f"model.{name}: must be >= 1, got {getattr(cfg, name)}")
    for name in ("n_shared_experts", "n_dense_layers"):
        if getattr(cfg, name) < 0:
            errors.append(f"model.{name}: must be >= 0, got {getattr(cfg, name)}")
    if cfg.top_k > cfg.n_experts >= 1:
        errors.append(f"model.top_k: {cfg.top_k} exceeds model.n_experts={cfg.n_experts}")
    if cfg.n_dense_layers >= cfg.n_layers >= 1:
        errors.append(f"model.n_dense_layers: {cfg.n_dense_layers} leaves no MoE block of the {cfg.n_layers} "
                      "layers; use fewer dense layers")
    if cfg.aux_loss_coef < 0:
        errors.append(f"model.aux_loss_coef: must be >= 0, got {cfg.aux_loss_coef}")
    if tp > 1:
        hidden = cfg.moe_hidden_dim * cfg.n_shared_experts
        if hidden % tp:
            errors.append(f"model.moe_hidden_dim: the shared expert's width {hidden} (moe_hidden_dim x "
                          f"n_shared_experts) is not divisible by parallel.tp_degree={tp}")
        if parallel.tp.plan is not None:
            errors.append("parallel.tp.plan: the moe model runs only its built-in TP plan (its MoE layers route "
                          "sequence shards, which plan patterns cannot express); remove parallel.tp.plan")
    return errors


def _build(cfg):
    from .moe import build_moe
    return build_moe(cfg)


def _tp_plan(model, layout, tp_cfg):
    from .tp_plan import build_moe_tp_plan
    return build_moe_tp_plan(model, tp_cfg.sequence_parallel, tp_cfg.loss_parallel)


def _describe_tp(tp_degree: int, seq_len: int) -> list[str]:
    return [f"each tp rank routes its {seq_len // tp_degree} of {seq_len} tokens per sequence; router gate and "
            "experts replicated over tp (gradients summed), shared expert split column/row-wise"]


MOE_SPEC = ModelSpec(
    name="moe", build=_build, layout=moe_layout, check=check_moe, tp_plan=_tp_plan,
    fsdp_units=("layers.*",), supports_pipeline=False, supports_context_parallel=True,
    experts=lambda cfg: cfg.n_experts, config_cls=MoEConfig, describe_tp=_describe_tp,
    description="built-in mixture-of-experts decoder (DeepSeek-V3 / Qwen3-MoE style), npudist.models.moe")
