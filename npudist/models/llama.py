"""A Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention.

Layout follows torchtitan so the parallel wrappers can address modules by stable names:
``tok_embeddings``, ``layers.<i>.{attention_norm,attention.{wq,wk,wv,wo},ffn_norm,feed_forward.{w1,w2,w3}}``,
``norm``, ``output``. ``layers`` is a ``ModuleDict`` keyed by the global layer index so that a pipeline stage
that deletes the layers it does not own keeps the same parameter names as the full model. Any of
``tok_embeddings``/``norm``/``output`` may be ``None`` on a pipeline stage; ``forward`` skips it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from npudist.models.rules import raise_if_invalid


class RMSNorm(nn.Module):
    """Root-mean-square norm written with elementwise ops so it also runs on DTensor (sequence parallel)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed * self.weight

    def reset_parameters(self):
        nn.init.ones_(self.weight)


def compute_rope_cache(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [max_seq_len, head_dim/2]; real-valued (no complex dtype) so any backend can hold them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) by position-dependent angles. x: [bs, seq, heads, head_dim]."""
    x_pairs = x.float().unflatten(-1, (-1, 2))
    x0, x1 = x_pairs[..., 0], x_pairs[..., 1]
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal grouped-query attention. Head counts are derived from the (possibly TP-sharded) projection
    outputs, so the same code runs on a full module and on a tensor-parallel shard."""

    def __init__(self, args):
        super().__init__()
        self.head_dim = args.head_dim
        self.n_rep = args.n_heads // args.kv_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        # Set by npudist.cp.apply_cp: this rank holds a shard of each sequence; it gives the shard's token
        # positions and runs attention over the whole sequence across the cp ranks.
        self.context_parallel = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x is the full sequence here even under sequence parallelism (the TP plan gathers it first), so
        # the rotary tables are sliced here rather than by the caller, who may only hold a sequence shard.
        bs, seqlen, _ = x.shape
        cp = self.context_parallel
        if cp is None:
            cos, sin = cos[:seqlen], sin[:seqlen]
        else:
            positions = cp.positions(seqlen, cos.device)
            cos, sin = cos[positions], sin[positions]
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=2)
            v = v.repeat_interleave(self.n_rep, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cp is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = cp.attention(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        # Depth-scaled init of the output projections (as in torchtitan) keeps the residual stream stable.
        self.out_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5

    def set_activation_checkpointing(self, context_fn=None) -> None:
        """Recompute this block's activations in backward. Done inside ``forward`` (not by a wrapper module or
        module hooks) so parameter names stay unchanged and FSDP's hooks on the block stay outside the
        recomputed region, which selective (op-level) checkpointing requires. ``context_fn`` as in
        ``torch.utils.checkpoint.checkpoint``."""
        self._ac_context_fn = context_fn
        self._ac_enabled = True

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if getattr(self, "_ac_enabled", False) and torch.is_grad_enabled():
            # No context_fn for full AC: Dynamo traces checkpoint() with a selective-checkpoint context_fn or
            # none, but not with torch's own noop_context_fn passed explicitly.
            extra = {} if self._ac_context_fn is None else {"context_fn": self._ac_context_fn}
            return torch.utils.checkpoint.checkpoint(self._forward, x, cos, sin, use_reentrant=False, **extra)
        return self._forward(x, cos, sin)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # The rotary tables go by keyword so TP input preparation only sees (and reshards) the activation.
        h = x + self.attention(self.attention_norm(x), cos=cos, sin=sin)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self):
        for lin in (self.attention.wq, self.attention.wk, self.attention.wv, self.feed_forward.w1):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
        for lin in (self.attention.wo, self.feed_forward.w2, self.feed_forward.w3):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=self.out_init_std)
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        raise_if_invalid(cfg)
        self.args = args = cfg
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): self.make_block(i, args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = compute_rope_cache(args.head_dim, args.max_seq_len, args.rope_theta)
        # Non-persistent: derived data, never checkpointed; moved with .to(device) like any buffer.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @staticmethod
    def make_block(layer_id: int, args) -> nn.Module:
        """Block ``layer_id``; a model with other blocks (npudist.models.moe) overrides this."""
        return TransformerBlock(layer_id, args)

    def _apply(self, fn, recurse=True):
        # Module.to() keeps shared parameters shared only when the new tensor type is "shallow-copy
        # compatible" with the old one; PyTorch counts CPU/CUDA/XPU/... but not PrivateUse1 devices such as
        # npu, so cpu -> npu would silently give the output head its own copy. Re-tie after any move.
        out = super()._apply(fn, recurse)
        if self.args.tie_embeddings and self.output is not None and self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight
        return out

    def init_weights(self):
        nn.init.normal_(self.tok_embeddings.weight, std=1.0 if not self.args.tie_embeddings else 0.02)
        for block in self.layers.values():
            block.init_weights()
        self.norm.reset_parameters()
        cutoff = 3 / self.args.dim ** 0.5
        nn.init.trunc_normal_(self.output.weight, std=self.args.dim ** -0.5, a=-cutoff, b=cutoff)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [bs, seq] int64 (or hidden states [bs, seq, dim] on a later pipeline stage) -> logits or
        hidden states (a stage without ``output``)."""
        if self.tok_embeddings is not None:
            if tokens.shape[1] > self.args.max_seq_len:
                raise ValueError(
                    f"sequence length {tokens.shape[1]} exceeds model.max_seq_len={self.args.max_seq_len}")
            h = self.tok_embeddings(tokens)
        else:
            h = tokens
        for block in self.layers.values():
            h = block(h, self.rope_cos, self.rope_sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def num_params(self, exclude_embedding: bool = False) -> int:
        n = sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
        if exclude_embedding and self.tok_embeddings is not None:
            n -= self.tok_embeddings.weight.numel()
        return n


def build_llama(cfg) -> Transformer:
    """The decoder a ``ModelConfig`` describes (built on the current default device)."""
    return Transformer(cfg)
