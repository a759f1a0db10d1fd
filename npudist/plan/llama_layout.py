"""The Llama decoder's module names and parameter shapes, derived from a ModelConfig without building
the model (torch-free). Must agree with ``npudist.models.llama`` (tested against it): the plan validator
uses the names to reject module patterns that match nothing, ``npudist plan check`` uses the shapes to
count parameters per rank.
"""
from __future__ import annotations

from .schema import ModelConfig

# Modules whose weight the built-in TP plan (npudist.models.tp_plan) splits across tp ranks.
BUILTIN_TP_SHARDED = ("tok_embeddings", "output", "layers.*.attention.w[qkvo]", "layers.*.feed_forward.w[123]")
BLOCK_LINEARS = ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                 "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")


def module_names(cfg: ModelConfig) -> list[str]:
    """Fully qualified names of every sub-module, as ``model.named_modules()`` lists them (minus the root)."""
    names = ["tok_embeddings", "layers"]
    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        names += [p, f"{p}.attention_norm", f"{p}.attention", f"{p}.attention.wq", f"{p}.attention.wk",
                  f"{p}.attention.wv", f"{p}.attention.wo", f"{p}.ffn_norm", f"{p}.feed_forward",
                  f"{p}.feed_forward.w1", f"{p}.feed_forward.w2", f"{p}.feed_forward.w3"]
    return names + ["norm", "output"]


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
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


def count_params(cfg: ModelConfig) -> int:
    """Total parameters (tied embeddings counted once)."""
    total = 0
    for shape in param_shapes(cfg).values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total
