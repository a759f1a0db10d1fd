"""Shape rules of a decoder-only transformer config (``ModelConfig``): the one place they live. The plan
validator reports them through the model spec (``"model.key: problem"`` lines, all at once) and the model
builders raise the same text, so a config that passes plan validation always builds."""
from __future__ import annotations

POSITIVE = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim", "max_seq_len")


def check_transformer(cfg, tp_degree: int = 1, rotary: bool = True) -> list[str]:
    """Every violated rule of ``cfg`` (a ModelConfig) for ``tp_degree`` tensor-parallel ranks."""
    errors = []
    for name in POSITIVE:
        value = getattr(cfg, name)
        if value is not None and value < 1:
            errors.append(f"model.{name}: must be >= 1, got {value}")
    if errors:
        return errors
    kv = cfg.n_kv_heads if cfg.n_kv_heads is not None else cfg.n_heads
    if cfg.dim % cfg.n_heads:
        errors.append(f"model.dim: {cfg.dim} is not divisible by model.n_heads={cfg.n_heads}")
    elif rotary and (cfg.dim // cfg.n_heads) % 2:
        errors.append(f"model.dim: head dim dim/n_heads = {cfg.dim // cfg.n_heads} must be even for rotary "
                      "embeddings")
    if cfg.n_heads % kv:
        errors.append(f"model.n_kv_heads: model.n_heads={cfg.n_heads} is not divisible by n_kv_heads={kv} "
                      "(each kv head serves a whole group of query heads)")
    if cfg.norm_eps <= 0:
        errors.append(f"model.norm_eps: must be > 0, got {cfg.norm_eps}")
    if cfg.rope_theta <= 0:
        errors.append(f"model.rope_theta: must be > 0, got {cfg.rope_theta}")
    if tp_degree > 1:
        explicit_kv = cfg.n_kv_heads is not None and cfg.n_kv_heads != cfg.n_heads   # else n_heads says it all
        for name, value in (("n_heads", cfg.n_heads), ("n_kv_heads", kv), ("ffn_hidden_dim", cfg.ffn_hidden_dim)):
            if name == "n_kv_heads" and not explicit_kv:
                continue
            if value % tp_degree:
                errors.append(f"model.{name}: {value} is not divisible by parallel.tp_degree={tp_degree} (tensor "
                              "parallelism splits it evenly over the tp ranks)")
        if cfg.vocab_size % tp_degree:
            errors.append(f"model.vocab_size: {cfg.vocab_size} is not divisible by parallel.tp_degree="
                          f"{tp_degree} (the embedding and output head are split over the vocabulary); pad "
                          "vocab_size up to a multiple")
    return errors


def raise_if_invalid(cfg, tp_degree: int = 1, rotary: bool = True) -> None:
    errors = check_transformer(cfg, tp_degree, rotary)
    if errors:
        raise ValueError("invalid model config: " + "; ".join(errors))
