"""transformers with npudist's torch_npu: it imports, detects the npu, and its Ascend flash-attention-2 path
(``attn_implementation="flash_attention_2"`` -> ``torch_npu.npu_fusion_attention``) equals "sdpa"."""
import pytest
import torch

transformers = pytest.importorskip("transformers",
                                   reason="transformers is not installed (pinned in requirements-test.txt)")

import torch_npu  # noqa: E402,F401
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

NPU = torch.device("npu:0")


def _models():
    def cfg():  # one config object per model: transformers stores the attention implementation on it
        return LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    sdpa = LlamaForCausalLM._from_config(cfg(), attn_implementation="sdpa", dtype=torch.float32).to(NPU)
    fa2 = LlamaForCausalLM._from_config(cfg(), attn_implementation="flash_attention_2", dtype=torch.float32).to(NPU)
    fa2.load_state_dict(sdpa.state_dict())
    assert sdpa.config._attn_implementation == "sdpa"
    assert fa2.config._attn_implementation == "flash_attention_2"
    return sdpa, fa2


def _run(model, ids, mask):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    out.loss.backward()
    return out.logits.detach().cpu(), {n: p.grad.cpu() for n, p in model.named_parameters()}


def _assert_rel(a, b, what, tol=1e-5):
    rel = (a - b).norm() / b.norm().clamp_min(1e-12)
    assert rel <= tol, f"{what}: relative difference {rel:.2e} > {tol}"


def test_npu_detected_and_flash_attention_routes_to_npu_fusion_attention(monkeypatch):
    from transformers.integrations import npu_flash_attention
    from transformers.utils import is_torch_npu_available

    assert is_torch_npu_available()
    assert npu_flash_attention.npu_fusion_attention is torch.ops.npu.npu_fusion_attention
    calls = []
    real = torch.ops.npu.npu_fusion_attention
    monkeypatch.setattr(npu_flash_attention, "npu_fusion_attention", lambda *a, **k: calls.append(k) or real(*a, **k))
    sdpa, fa2 = _models()
    ids = torch.randint(0, 96, (1, 8), device=NPU)
    sdpa(input_ids=ids)
    assert not calls
    fa2(input_ids=ids)
    assert len(calls) == 2 and calls[0]["sparse_mode"] == 3  # one per layer, causal bottom-right


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded_varlen_TND"])
def test_flash_attention_2_matches_sdpa_logits_and_grads(padded):
    sdpa, fa2 = _models()
    torch.manual_seed(1)
    ids = torch.randint(0, 96, (2, 12), device=NPU)
    mask = None
    if padded:  # left padding of 3 tokens on sample 0 -> transformers' unpad + TND varlen path
        mask = torch.ones(2, 12, dtype=torch.long, device=NPU)
        mask[0, :3] = 0
    logits_ref, grads_ref = _run(sdpa, ids, mask)
    logits, grads = _run(fa2, ids, mask)
    keep = slice(None) if mask is None else mask.cpu().bool()
    _assert_rel(logits[keep], logits_ref[keep], "logits")
    for name, g in grads_ref.items():
        _assert_rel(grads[name], g, f"grad of {name}")
