"""A user's own model, trained by npudist through a plan that names it (see plans/user_module.yaml):

    model:
      name: module
      module: user_model:build_model

``examples/train.py`` runs with ``examples/`` on ``sys.path``, so ``user_model`` imports as is; for a model
elsewhere, put its package on ``PYTHONPATH``. The builder receives the plan's ``model`` section (a
``ModelConfig``) and returns any ``nn.Module`` mapping token ids ``[batch, seq]`` to logits
``[batch, seq, vocab_size]``. This one is deliberately not a transformer: blocks mix tokens with a causal
running mean (each position sees only itself and the past) and then an MLP.
"""
from __future__ import annotations

import torch
from torch import nn


class CausalMeanBlock(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mix = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        counts = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype).view(1, -1, 1)
        x = x + self.mix(h.cumsum(dim=1) / counts)
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, n_blocks: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList([CausalMeanBlock(dim, hidden) for _ in range(n_blocks)])
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build_model(cfg) -> TinyLM:
    """The plan's model fields, reused: vocab_size, dim, n_layers (blocks), ffn_hidden_dim."""
    return TinyLM(cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.ffn_hidden_dim)
