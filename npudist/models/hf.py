"""HuggingFace transformers causal LMs (Llama, Qwen2, Mistral, ... decoders) randomly initialised from a
config given in the plan, run so the parallel wrappers can treat them like the built-in decoder.

``HFCausalLM`` holds the HF model's own sub-modules under their HF names (``model.embed_tokens``,
``model.layers.<i>``, ``model.norm``, ``lm_head``, ``model.rotary_emb``), so parameter names and state dicts
are the HF ones. Two differences from calling the HF model: ``model.layers`` is a ``ModuleDict`` keyed by
the layer index (a pipeline stage deletes the layers it does not own and keeps the names), and ``forward``
skips the embedding / final norm / head when a pipeline stage set them to None. Attention is PyTorch SDPA
with its causal flag (no mask tensor): sequences are unpadded fixed-length windows.
"""
from __future__ import annotations

import torch
from torch import nn


def hf_config(cfg):
    """The transformers config for a plan's ``model`` section (ModelConfig): the shared fields mapped to the
    HF names, then ``model.hf_config`` on top."""
    try:
        from transformers import AutoConfig
    except ImportError as e:
        raise ImportError(f"model.name: hf_causal_lm needs the transformers package, which failed to import "
                          f"({e}); pip install transformers (see requirements-test.txt)") from e
    kwargs = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, num_hidden_layers=cfg.n_layers,
                  num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
                  intermediate_size=cfg.ffn_hidden_dim, max_position_embeddings=cfg.max_seq_len,
                  rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings)
    kwargs.update(cfg.hf_config or {})
    try:
        return AutoConfig.for_model(cfg.hf_model_type, **kwargs)
    except (KeyError, ValueError) as e:
        raise ValueError(f"model.hf_model_type: transformers has no config for {cfg.hf_model_type!r} ({e})") from e


class HFCausalLM(nn.Module):
    """tokens [bs, seq] (or hidden states on a later pipeline stage) -> logits [bs, seq, vocab]."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.config = hf_model.config
        self.model = hf_model.model
        self.lm_head = hf_model.lm_head
        self.model.layers = nn.ModuleDict({str(i): layer for i, layer in enumerate(hf_model.model.layers)})

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inner = self.model
        h = inner.embed_tokens(tokens) if inner.embed_tokens is not None else tokens
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        rotary = inner.rotary_emb(h, positions)
        for layer in inner.layers.values():
            h = layer(h, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        if inner.norm is not None:
            h = inner.norm(h)
        if self.lm_head is not None:
            h = self.lm_head(h)
        return h


def build_hf_causal_lm(cfg) -> HFCausalLM:
    """Random init (from torch's RNG) of the causal LM ``cfg`` describes, on the current default device."""
    from transformers import AutoModelForCausalLM
    config = hf_config(cfg)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    if not hasattr(model, "model") or not hasattr(model.model, "layers") or not hasattr(model, "lm_head"):
        raise ValueError(f"model.hf_model_type: {cfg.hf_model_type!r} builds {type(model).__name__}, which is "
                         "not a decoder with model.layers and lm_head; hf_causal_lm runs Llama-like decoders")
    return HFCausalLM(model)
