"""A HuggingFace model compiles on npu: transformers' Llama, fwd + bwd, no graph break, equal to eager."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers",
                                   reason="transformers is not installed (pinned in requirements-test.txt)")

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("compile")]


def test_hf_llama_compiles_without_graph_breaks_and_matches_eager():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    eager = transformers.LlamaForCausalLM(cfg).npu()
    compiled = copy.deepcopy(eager)
    ids = torch.randint(0, cfg.vocab_size, (2, 16), device="npu")
    torch._dynamo.reset()

    explained = torch._dynamo.explain(compiled)(input_ids=ids, labels=ids)
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]

    loss = torch.compile(compiled, fullgraph=True)(input_ids=ids, labels=ids).loss
    loss.backward()
    ref = eager(input_ids=ids, labels=ids).loss
    ref.backward()
    assert loss.device.type == "npu"
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
