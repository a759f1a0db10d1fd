"""The npudist_ep experts implementation of transformers MoE blocks (npudist.models.hf_moe), in one process:
with every expert local it computes what transformers' own eager experts forward computes (output and
gradients), for Qwen2-MoE and Mixtral; unsupported expert layouts are refused by name."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from npudist.models.hf_moe import _check_supported, ep_experts_forward  # noqa: E402
from npudist.models.moe import LocalDispatch  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _experts(model_type: str):
    from transformers import AutoConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeExperts
    kw = dict(hidden_size=32, intermediate_size=24, moe_intermediate_size=24, num_experts=4, num_local_experts=4,
              num_experts_per_tok=2)
    config = AutoConfig.for_model(model_type, **kw)
    config._experts_implementation = "eager"
    experts = (Qwen2MoeExperts if model_type == "qwen2_moe" else MixtralExperts)(config)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.1)
    torch.nn.init.normal_(experts.down_proj, std=0.1)
    return experts


@pytest.mark.parametrize("model_type", ["qwen2_moe", "mixtral"])
def test_npudist_ep_forward_matches_the_eager_experts(model_type):
    torch.manual_seed(0)
    experts = _experts(model_type)
    x = torch.randn(10, 32, requires_grad=True)
    scores = torch.randn(10, 4).softmax(-1)
    weights, ids = scores.topk(2, dim=-1)
    weights = weights.detach().requires_grad_()
    g = torch.randn(10, 32)

    def run(forward):
        for t in (x, weights, experts.gate_up_proj, experts.down_proj):
            t.grad = None
        out = forward(experts, x, ids, weights)
        out.backward(g)
        return [out.detach(), *(t.grad.clone() for t in (x, weights, experts.gate_up_proj, experts.down_proj))]

    experts.npudist_dispatch, experts.npudist_grad_scale = LocalDispatch(), 1.0
    want = run(lambda m, *a: m.forward(*a))          # config says eager: transformers' own loop
    got = run(ep_experts_forward)
    for name, a, b in zip(("out", "dx", "dweights", "dgate_up", "ddown"), got, want):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), f"{model_type} {name}: {(a - b).abs().max()}"


def test_unsupported_expert_layout_is_refused_by_name():
    experts = _experts("qwen2_moe")
    experts.has_bias = True
    with pytest.raises(ValueError, match=r"Qwen2MoeExperts \(model.layers.0.mlp.experts\) stores its experts as "
                                         r"has_bias, which npudist's expert parallel does not run"):
        _check_supported("model.layers.0.mlp.experts", experts)
