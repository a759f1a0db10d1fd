"""A mixture-of-experts decoder in the DeepSeek-V3 / Qwen3-MoE shape, built on the Llama decoder's attention.

Every block from ``n_dense_layers`` on replaces the SwiGLU feed-forward with ``MoE``:

* ``router``: a linear gate scores every expert (softmax as Qwen3-MoE, or sigmoid as DeepSeek-V3) and each
  token goes to its ``top_k`` experts, weighted by its (renormalised) scores;
* ``experts``: ``n_experts`` SwiGLU experts held as grouped weights ``w1/w3 [E, hidden, dim]``,
  ``w2 [E, dim, hidden]`` (one tensor per projection, so expert parallelism shards dim 0);
* ``shared_expert``: a SwiGLU every token passes through;
* load balancing: DeepSeek-V3's sequence-wise auxiliary loss, injected into the gradient by ``AddAuxLoss``
  (the forward value is untouched, so the training loss and the loss function stay those of the dense model).

Tokens reach their experts through a dispatcher: ``LocalDispatch`` here, the all-to-all of
``npudist.ep.AllToAllDispatch`` under expert parallelism. Under tensor parallelism (``npudist.models.tp_plan``)
each tp rank routes only 1/tp of every sequence (``token_group``; ``token_split`` cuts it out of a replicated
sequence and gathers the result back): router and experts are replicated over tp, so their gradients are
summed over the tp group (``SumGradOver``). Per-expert token counts of the routing are kept
in ``tokens_per_expert`` (summed until read by ``take_expert_load``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from npudist.models.llama import Attention, FeedForward, RMSNorm, Transformer, TransformerBlock


class AddAuxLoss(torch.autograd.Function):
    """Returns ``x`` unchanged; in backward also gives ``aux`` the gradient ``scale`` (1: as if ``aux`` had been
    added to the final loss; the DeepSeek-V2/V3 trick: the loss function and the logged loss need not know
    about it)."""

    @staticmethod
    def forward(ctx, x, aux, scale: float = 1.0):
        ctx.aux_shape, ctx.aux_dtype, ctx.scale = aux.shape, aux.dtype, scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.full(ctx.aux_shape, ctx.scale, dtype=ctx.aux_dtype, device=grad.device), None


class SumGradOver(torch.autograd.Function):
    """Identity forward; backward sums the gradient over ``group``. For a weight every rank of the group holds
    whole but applies to different tokens (Megatron's copy-to-region, here on a weight): the sum of the
    ranks' gradients is the gradient over all tokens."""

    @staticmethod
    def forward(ctx, w, group):
        ctx.group = group
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ScaleGrad(torch.autograd.Function):
    """Identity forward, gradient times ``scale`` in backward (see ``GroupedExperts.grad_scale``)."""

    @staticmethod
    def forward(ctx, x, scale: float):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class Router(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.gate = nn.Linear(args.dim, args.n_experts, bias=False)
        self.top_k, self.score_func, self.route_norm = args.top_k, args.score_func, args.route_norm

    def forward(self, x: torch.Tensor, token_group=None):
        """x [tokens, dim] -> (top-k weights [tokens, k], expert ids [tokens, k], scores [tokens, E]).
        ``token_group``: the ranks that hold this gate whole and route other tokens with it (tp)."""
        weight = self.gate.weight if token_group is None else SumGradOver.apply(self.gate.weight, token_group)
        logits = F.linear(x, weight).float()
        scores = logits.softmax(-1) if self.score_func == "softmax" else logits.sigmoid()
        weights, experts = scores.topk(self.top_k, dim=-1)
        if self.route_norm or self.score_func == "sigmoid":
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, experts, scores


class GroupedExperts(nn.Module):
    """``n`` SwiGLU experts as three grouped weights. Under expert parallelism the weights are DTensors
    sharded on dim 0 over the ep ranks and this rank computes only its local experts."""

    def __init__(self, n: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n, hidden, dim))
        # Set by npudist.ep: every ep rank's tokens contribute to these weights' gradients while each rank's
        # loss is a mean over its own tokens; the factor turns the sum over the ep ranks into their mean.
        self.grad_scale = 1.0
        # Set by the TP plan: the tp ranks hold the same experts and send them different tokens.
        self.grad_sum_group = None

    def local_weights(self) -> list[torch.Tensor]:
        out = []
        for w in (self.w1, self.w2, self.w3):
            w = w.to_local() if hasattr(w, "to_local") else w
            if self.grad_sum_group is not None:
                w = SumGradOver.apply(w, self.grad_sum_group)
            out.append(ScaleGrad.apply(w, self.grad_scale) if self.grad_scale != 1.0 else w)
        return out

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x [tokens, dim] grouped by expert, ``counts[e]`` rows for local expert e -> [tokens, dim]."""
        w1, w2, w3 = self.local_weights()
        outs, start = [], 0
        for e, n in enumerate(counts):
            xe = x[start:start + n]
            start += n
            outs.append((F.silu(xe @ w1[e].t()) * (xe @ w3[e].t())) @ w2[e].t())
        return torch.cat(outs) if outs else x[:0]

    def init_weights(self, out_std: float) -> None:
        nn.init.trunc_normal_(self.w1, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.w2, mean=0.0, std=out_std)
        nn.init.trunc_normal_(self.w3, mean=0.0, std=out_std)


class LocalDispatch:
    """All experts on this rank: the expert-sorted tokens go straight to them."""

    def dispatch(self, x: torch.Tensor, counts: torch.Tensor):
        return x, counts.tolist(), None

    def combine(self, y: torch.Tensor, ctx) -> torch.Tensor:
        return y


def sequence_aux_loss(scores: torch.Tensor, experts: torch.Tensor, batch: int, coef: float, normalize: bool,
                      seq_group=None) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss, averaged over the sequences: coef * E * sum_i f_i * P_i with
    f_i the share of a sequence's k routing slots that chose expert i and P_i expert i's mean (normalised)
    score over the sequence. With ``seq_group`` (context parallel: each rank holds part of every sequence)
    the per-sequence sums are added up over the group first."""
    n_experts, k = scores.shape[-1], experts.shape[-1]
    scores = scores.view(batch, -1, n_experts)
    if normalize:
        scores = scores / scores.sum(-1, keepdim=True)
    chosen = F.one_hot(experts.view(batch, -1), n_experts).sum(1).to(scores.dtype)   # [batch, E]
    score_sum = scores.sum(1)
    tokens = scores.shape[1]
    if seq_group is not None:
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol
        n = dist.get_world_size(seq_group)
        dist.all_reduce(chosen, group=seq_group)
        # The sum as an all-gather: its backward hands every rank the gradient of its own partial sum.
        score_sum = funcol.all_gather_single_autograd(score_sum.unsqueeze(0), 0, seq_group).sum(0)
        tokens *= n
    f = chosen / (k * tokens)
    p = score_sum / tokens
    return coef * n_experts * (f * p).sum(-1).mean()


class MoE(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_experts, self.top_k = args.n_experts, args.top_k
        self.router = Router(args)
        self.experts = GroupedExperts(args.n_experts, args.dim, args.moe_hidden_dim)
        hidden = args.moe_hidden_dim * args.n_shared_experts
        self.shared_expert = FeedForward(args.dim, hidden) if hidden else None
        self.aux_loss_coef, self.score_func = args.aux_loss_coef, args.score_func
        self.dispatcher = LocalDispatch()
        self.seq_group = None          # the cp (or, with sequence parallel TP, tp) group: sequence shards
        self.token_group = None        # the tp group: ranks routing different tokens with the same router
        self.token_split = None        # TP without sequence parallel: cuts this rank's tokens out and back in
        self.aux_grad_scale = 1.0      # 1/tp under TP: every tp rank backpropagates the same aux loss
        self.register_buffer("tokens_per_expert", torch.zeros(args.n_experts), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed_x = x if self.token_split is None else self.token_split.scatter(x)
        bs, seqlen, dim = routed_x.shape
        tokens = routed_x.reshape(-1, dim)
        weights, experts, scores = self.router(tokens, self.token_group)
        flat = experts.reshape(-1)
        counts = torch.bincount(flat, minlength=self.n_experts)
        if torch._C._current_graph_task_id() == -1:   # not an activation-checkpoint recompute in backward
            with torch.no_grad():
                self.tokens_per_expert += counts.to(self.tokens_per_expert.dtype)
        order = flat.argsort(stable=True)                  # routing slots grouped by expert
        local, local_counts, ctx = self.dispatcher.dispatch(tokens[order // self.top_k], counts)
        routed = self.dispatcher.combine(self.experts(local, local_counts), ctx)
        unsorted = torch.empty_like(routed).index_copy(0, order, routed)
        out = (unsorted.view(-1, self.top_k, dim) * weights.unsqueeze(-1).to(unsorted.dtype)).sum(1)
        out = out.view(bs, seqlen, dim)
        if self.token_split is not None:
            out = self.token_split.gather(out)
        if self.shared_expert is not None:
            out = out + self.shared_expert(x)
        if self.training and self.aux_loss_coef > 0 and torch.is_grad_enabled():
            aux = sequence_aux_loss(scores, experts, bs, self.aux_loss_coef, self.score_func == "sigmoid",
                                    self.seq_group)
            out = AddAuxLoss.apply(out, aux, self.aux_grad_scale)
        return out

    def init_weights(self, out_std: float) -> None:
        nn.init.trunc_normal_(self.router.gate.weight, mean=0.0, std=0.02)
        self.experts.init_weights(out_std)
        if self.shared_expert is not None:
            nn.init.trunc_normal_(self.shared_expert.w1.weight, mean=0.0, std=0.02)
            for lin in (self.shared_expert.w2, self.shared_expert.w3):
                nn.init.trunc_normal_(lin.weight, mean=0.0, std=out_std)


class MoEBlock(TransformerBlock):
    """A decoder block whose feed-forward is ``moe`` (attention, norms and activation checkpointing as Llama's)."""

    def __init__(self, layer_id: int, args):
        nn.Module.__init__(self)
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.moe = MoE(args)
        self.out_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos=cos, sin=sin)
        return h + self.moe(self.ffn_norm(h))

    def init_weights(self):
        for lin in (self.attention.wq, self.attention.wk, self.attention.wv):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.attention.wo.weight, mean=0.0, std=self.out_init_std)
        self.moe.init_weights(self.out_init_std)
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()


class MoETransformer(Transformer):
    @staticmethod
    def make_block(layer_id: int, args) -> nn.Module:
        # the first n_dense_layers blocks stay dense (as moe_spec's layout says)
        return MoEBlock(layer_id, args) if layer_id >= args.n_dense_layers else TransformerBlock(layer_id, args)


def moe_layers(model: nn.Module) -> list[tuple[str, MoE]]:
    """(name, module) of every MoE layer of ``model`` (or of a pipeline stage of it)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, MoE)]


def take_expert_load(model: nn.Module) -> dict[str, list[float]]:
    """Routed token slots per expert since the last call, by MoE layer (this rank's tokens); resets them."""
    out = {}
    for name, moe in moe_layers(model):
        out[name] = moe.tokens_per_expert.tolist()
        moe.tokens_per_expert.zero_()
    return out


def build_moe(cfg) -> MoETransformer:
    """The MoE decoder a ``MoEConfig`` describes (built on the current default device)."""
    return MoETransformer(cfg)
