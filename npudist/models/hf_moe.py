"""Expert parallelism for HuggingFace transformers MoE decoders (Qwen2-MoE, Mixtral, Qwen3-MoE, ...).

transformers (5.x) stores a sparse block's experts as one module with grouped weights, ``gate_up_proj
[E, 2 * inter, hidden]`` and ``down_proj [E, hidden, inter]``, and picks that module's forward by name from
its ``ExpertsInterface`` (``config._experts_implementation``: eager, grouped_mm, ...).
``prepare_expert_parallel`` (the spec's ``expert_parallel`` hook) registers one more implementation there,
``npudist_ep`` (the interface's own registration API, a new key: other models keep theirs), switches this
model to it with ``set_experts_implementation`` and hands the experts modules to ``npudist.ep.apply_ep``,
which shards the grouped weights over the ep ranks and gives each module its dispatcher; the implementation
sends every routing slot to the rank holding its expert with ``npudist.ep.AllToAllDispatch``
(all_to_all_single, uneven splits) and back. The router, the
shared expert and everything else stay the HF model's own code.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IMPLEMENTATION = "npudist_ep"


def hf_expert_count(config) -> int:
    """Routed experts per sparse block of a transformers config (0: a dense model)."""
    for name in ("num_experts", "num_local_experts", "n_routed_experts"):
        n = getattr(config, name, None)
        if isinstance(n, int) and n > 0:
            return n
    return 0


def hf_expert_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every transformers grouped-experts module (one per sparse block)."""
    return [(n, m) for n, m in model.named_modules()
            if hasattr(m, "is_transposed") and isinstance(getattr(m, "down_proj", None), nn.Parameter)
            and getattr(m, "down_proj").dim() == 3]


def _check_supported(name: str, experts: nn.Module) -> None:
    unsupported = [flag for flag, bad in (("has_bias", experts.has_bias),
                                          ("has_post_expert_norm", experts.has_post_expert_norm),
                                          ("not is_concatenated", not experts.is_concatenated),
                                          ("not has_gate", not experts.has_gate)) if bad]
    if unsupported:
        raise ValueError(f"parallel.ep_degree: {type(experts).__name__} ({name}) stores its experts as "
                         f"{', '.join(unsupported)}, which npudist's expert parallel does not run; supported "
                         "are concatenated gate_up_proj / down_proj without bias (Qwen2-MoE, Mixtral, Qwen3-MoE)")


def _expert_linear(x: torch.Tensor, w: torch.Tensor, transposed: bool) -> torch.Tensor:
    return x @ w if transposed else F.linear(x, w)


def ep_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ``npudist_ep`` experts implementation: hidden_states [tokens, hidden], the router's top-k expert
    ids and weights [tokens, k] -> the weighted sum of the chosen experts' outputs [tokens, hidden]."""
    from npudist.models.moe import ScaleGrad
    dispatcher, grad_scale = self.npudist_dispatch, self.npudist_grad_scale
    tokens, k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    counts = torch.bincount(flat, minlength=self.num_experts)
    order = flat.argsort(stable=True)                    # routing slots grouped by expert
    local, local_counts, ctx = dispatcher.dispatch(hidden_states[order // k], counts)
    gate_up, down = (ScaleGrad.apply(w.to_local() if hasattr(w, "to_local") else w, grad_scale)
                     for w in (self.gate_up_proj, self.down_proj))
    outs, start = [], 0
    for e, n in enumerate(local_counts):
        xe = local[start:start + n]
        start += n
        h = self._apply_gate(_expert_linear(xe, gate_up[e], self.is_transposed))
        outs.append(_expert_linear(h, down[e], self.is_transposed))
    routed = dispatcher.combine(torch.cat(outs) if outs else local[:0], ctx)
    unsorted = torch.empty_like(routed).index_copy(0, order, routed)
    out = (unsorted.view(tokens, k, -1) * top_k_weights.unsqueeze(-1).to(unsorted.dtype)).sum(1)
    return out.to(hidden_states.dtype)


def register_implementation() -> None:
    """Make ``npudist_ep`` a transformers experts implementation (once; models opt in by name)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface
    if IMPLEMENTATION not in ALL_EXPERTS_FUNCTIONS:
        ExpertsInterface.register(IMPLEMENTATION, ep_experts_forward)


def prepare_expert_parallel(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Switch an ``HFCausalLM`` (or pipeline stage of it) to the ``npudist_ep`` experts implementation and
    return its grouped-experts modules, for ``npudist.ep.apply_ep`` to shard (their ``[E, ...]`` weights) and
    to give a dispatcher (``npudist_dispatch``) and gradient factor (``npudist_grad_scale``)."""
    found = hf_expert_modules(model)
    if not found:
        raise ValueError("parallel.ep_degree: this hf_causal_lm model has no grouped experts module (a "
                         "transformers MoE decoder such as qwen2_moe or mixtral has one per sparse block); set "
                         "parallel.ep_degree: 1")
    for name, experts in found:
        _check_supported(name, experts)
    register_implementation()
    model.model.set_experts_implementation(IMPLEMENTATION)
    return found
