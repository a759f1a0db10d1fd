"""Spec ``hf_causal_lm``: a HuggingFace transformers decoder (``model.hf_model_type``: llama, qwen2,
mistral, ... and the MoE decoders qwen2_moe, mixtral, qwen3_moe) with random init from the plan's model fields
plus ``model.hf_config``. transformers is an optional dependency: it is imported only when such a model is
built or checked. MoE decoders run under expert parallelism through ``npudist.models.hf_moe``."""
from __future__ import annotations

from .rules import check_transformer
from .spec import ModelSpec, layout_from_module

BLOCK = "model.layers.*"
# The built-in TP plan, as plan patterns (resolved by npudist.tp like a user's parallel.tp.plan).
TP_PLAN = {
    "model.embed_tokens": "rowwise",
    "model.layers.*.self_attn.[qkv]_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.gate_proj": "colwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": "rowwise",
    "lm_head": "colwise",
}


def check_hf(cfg, parallel) -> list[str]:
    errors = check_transformer(cfg, parallel.tp_degree if parallel.tp_degree >= 1 else 1)
    for name, degree in (("tp_degree", parallel.tp_degree), ("pp_degree", parallel.pp_degree)):
        if parallel.ep_degree > 1 and degree > 1:
            errors.append(f"parallel.ep_degree: expert parallel of an hf_causal_lm MoE model together with "
                          f"parallel.{name} > 1 is not supported; set one of them to 1")
    if parallel.tp_degree > 1 and parallel.tp.sequence_parallel and parallel.tp.plan is None:
        errors.append("parallel.tp.sequence_parallel: not supported for hf_causal_lm (the HF decoder computes "
                      "rotary positions from the sequence length it sees); set it to false")
    return errors


def hf_layout(cfg):
    import dataclasses

    import torch

    from .hf import build_hf_causal_lm
    from .hf_moe import hf_expert_modules
    from .llama_spec import transformer_dims
    with torch.device("meta"):
        model = build_hf_causal_lm(cfg)
    layout = layout_from_module(
        model, blocks=tuple(f"model.layers.{i}" for i in range(cfg.n_layers)), first=("model.embed_tokens",),
        last=("model.norm", "lm_head"), head="lm_head",
        tp_sharded=tuple(p for p, s in TP_PLAN.items() if s in ("colwise", "rowwise")), dims=transformer_dims(cfg))
    return dataclasses.replace(layout, experts=tuple(name for name, _ in hf_expert_modules(model)))


def hf_experts(cfg) -> int:
    """Routed experts per sparse block of the configured decoder (0: dense)."""
    from .hf import hf_config
    from .hf_moe import hf_expert_count
    return hf_expert_count(hf_config(cfg))


def _expert_parallel(model):
    from .hf_moe import prepare_expert_parallel
    return prepare_expert_parallel(model)


def _variant(cfg) -> str:
    return cfg.hf_model_type


def _build(cfg):
    from .hf import build_hf_causal_lm
    return build_hf_causal_lm(cfg)


HF_SPEC = ModelSpec(
    name="hf_causal_lm", build=_build, layout=hf_layout, check=check_hf, tp_plan=TP_PLAN,
    fsdp_units=(BLOCK,), supports_pipeline=True, experts=hf_experts, expert_parallel=_expert_parallel,
    variant=_variant,
    description="HuggingFace transformers causal LM (random init), npudist.models.hf")
