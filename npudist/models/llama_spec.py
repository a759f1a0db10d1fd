"""The built-in Llama decoder as a model spec: its layout (module names and parameter shapes derived from a
ModelConfig without building the model, torch-free) and lazy hooks to build it and its TP plan.
Must agree with ``npudist.models.llama`` (tests/plan/test_estimate_vs_model.py compares them).
"""
from __future__ import annotations

from .rules import check_transformer
from .spec import ModelLayout, ModelSpec, TransformerDims

# Modules whose weight the built-in TP plan (npudist.models.tp_plan) splits across tp ranks.
BUILTIN_TP_SHARDED = ("tok_embeddings", "output", "layers.*.attention.w[qkvo]", "layers.*.feed_forward.w[123]")


def module_names(cfg) -> list[str]:
    """Fully qualified names of every sub-module, as ``model.named_modules()`` lists them (minus the root)."""
    names = ["tok_embeddings", "layers"]
    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        names += [p, f"{p}.attention_norm", f"{p}.attention", f"{p}.attention.wq", f"{p}.attention.wk",
                  f"{p}.attention.wv", f"{p}.attention.wo", f"{p}.ffn_norm", f"{p}.feed_forward",
                  f"{p}.feed_forward.w1", f"{p}.feed_forward.w2", f"{p}.feed_forward.w3"]
    return names + ["norm", "output"]


def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape for the whole model. A tied output head is listed once (as the embedding)."""
    d, f, v, kv = cfg.dim, cfg.ffn_hidden_dim, cfg.vocab_size, cfg.kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (v, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        shapes.update({
            f"{p}.attention_norm.weight": (d,),
            f"{p}.attention.wq.weight": (cfg.n_heads * cfg.head_dim, d),
            f"{p}.attention.wk.weight": (kv, d),
            f"{p}.attention.wv.weight": (kv, d),
            f"{p}.attention.wo.weight": (d, cfg.n_heads * cfg.head_dim),
            f"{p}.ffn_norm.weight": (d,),
            f"{p}.feed_forward.w1.weight": (f, d),
            f"{p}.feed_forward.w2.weight": (d, f),
            f"{p}.feed_forward.w3.weight": (f, d),
        })
    shapes["norm.weight"] = (d,)
    if not cfg.tie_embeddings:
        shapes["output.weight"] = (v, d)
    return shapes


def transformer_dims(cfg) -> TransformerDims:
    return TransformerDims(dim=cfg.dim, q_width=cfg.n_heads * cfg.head_dim, kv_width=cfg.kv_heads * cfg.head_dim,
                           ffn_hidden=cfg.ffn_hidden_dim, vocab_size=cfg.vocab_size)


def llama_layout(cfg) -> ModelLayout:
    return ModelLayout(
        modules=tuple(module_names(cfg)), params=param_shapes(cfg),
        blocks=tuple(f"layers.{i}" for i in range(cfg.n_layers)), first=("tok_embeddings",),
        last=("norm", "output"), head="output",
        tied=(("tok_embeddings", "output"),) if cfg.tie_embeddings else (),
        tp_sharded=BUILTIN_TP_SHARDED, dims=transformer_dims(cfg))


def check_llama(cfg, parallel) -> list[str]:
    return check_transformer(cfg, parallel.tp_degree if parallel.tp_degree >= 1 else 1)


def _build(cfg):
    from .llama import build_llama
    return build_llama(cfg)


def _tp_plan(model, layout, tp_cfg):
    from .tp_plan import build_llama_tp_plan
    return build_llama_tp_plan(model, tp_cfg.sequence_parallel, tp_cfg.loss_parallel)


LLAMA_SPEC = ModelSpec(
    name="llama", build=_build, layout=llama_layout, check=check_llama, tp_plan=_tp_plan,
    fsdp_units=("layers.*",), supports_pipeline=True, supports_context_parallel=True,
    description="built-in Llama-style decoder (RMSNorm, RoPE, SwiGLU, GQA), npudist.models.llama")
