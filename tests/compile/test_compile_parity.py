"""torch.compile on npu matches eager: forward and gradients, no graph breaks, outputs on npu."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from npudist.models.llama import Transformer, TransformerBlock
from npudist.plan.schema import ModelConfig
from npudist.models.llama import compute_rope_cache

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("compile")]

TOL = 1e-4


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 32), nn.SiLU())


def _block_and_inputs():
    args = ModelConfig(dim=32, n_heads=4, ffn_hidden_dim=96, max_seq_len=16)
    block = TransformerBlock(0, args)
    block.init_weights()
    cos, sin = compute_rope_cache(args.head_dim, args.max_seq_len, args.rope_theta)
    return block, (cos, sin), args


def _assert_close(compiled, eager):
    assert compiled.device.type == "npu", compiled.device
    torch.testing.assert_close(compiled, eager, atol=TOL, rtol=TOL)


def _check_parity(model_cpu: nn.Module, make_inputs, loss_fn, **compile_kwargs):
    """Train step (fwd + bwd) of an npu copy, eager vs compiled, from identical weights."""
    eager = model_cpu.npu()
    compiled_model = copy.deepcopy(eager)
    step = torch.compile(lambda *a: loss_fn(compiled_model(*a)), **compile_kwargs)
    inputs = make_inputs()
    loss_c = step(*inputs)
    loss_c.backward()
    loss_e = loss_fn(eager(*inputs))
    loss_e.backward()
    _assert_close(loss_c, loss_e)
    for (name, p_c), p_e in zip(compiled_model.named_parameters(), eager.parameters()):
        assert p_c.grad is not None, name
        _assert_close(p_c.grad, p_e.grad)
    return compiled_model, step


def _graph_breaks(fn, *inputs) -> int:
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*inputs).graph_break_count


def test_mlp_fwd_bwd_matches_eager_fullgraph():
    torch.manual_seed(0)
    x = torch.randn(8, 32, device="npu", requires_grad=True)
    model, _ = _check_parity(mlp(), lambda: (x,), lambda y: y.square().mean(), fullgraph=True)
    assert _graph_breaks(model, x) == 0


def test_transformer_block_fwd_bwd_matches_eager():
    torch.manual_seed(0)
    block, (cos, sin), args = _block_and_inputs()
    cos, sin = cos.npu(), sin.npu()
    x = torch.randn(2, args.max_seq_len, args.dim, device="npu")
    model, _ = _check_parity(block, lambda: (x, cos, sin), lambda y: y.square().mean(), fullgraph=True)
    assert _graph_breaks(model, x, cos, sin) == 0


def test_llama_fwd_bwd_matches_eager_no_graph_break():
    torch.manual_seed(0)
    args = ModelConfig(dim=32, n_layers=2, n_heads=4, ffn_hidden_dim=96, max_seq_len=16)
    tokens = torch.randint(0, args.vocab_size, (2, 16), device="npu")
    targets = torch.randint(0, args.vocab_size, (2, 16), device="npu")

    def loss_fn(logits):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    model, _ = _check_parity(Transformer(args), lambda: (tokens,), loss_fn, fullgraph=True)
    assert _graph_breaks(lambda t: loss_fn(model(t)), tokens) == 0


def test_every_buffer_the_compiled_code_allocates_is_npu():
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = mlp().npu()
    x = torch.randn(8, 32, device="npu")
    before = torch.npu.memory_stats()["allocation.all.allocated"]
    out, (source,) = run_and_get_code(torch.compile(model), x)
    assert out.device.type == "npu"
    call = source[source.index("def call("):]
    assert "empty_strided(" in call and "device='npu'" in call
    for line in call.splitlines():
        if "empty_strided" in line:
            assert "device='npu'" in line and "empty_strided_cpu" not in line, line
    assert "cpp_fused" in source  # fused C++ kernels, not only aten fallbacks
    assert torch.npu.memory_stats()["allocation.all.allocated"] > before  # the npu allocator served them


def test_dynamic_shapes_one_graph_for_many_batch_sizes():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = mlp().npu()
    compiled = torch.compile(model, dynamic=True, fullgraph=True)
    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for batch in (3, 5, 11):
        x = torch.randn(batch, 32, device="npu")
        _assert_close(compiled(x), model(x))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames_before == 1


def test_max_autotune_no_cudagraphs_matches_eager():
    torch.manual_seed(0)
    x = torch.randn(8, 32, device="npu", requires_grad=True)
    _check_parity(mlp(), lambda: (x,), lambda y: y.square().mean(), mode="max-autotune-no-cudagraphs")


def test_npu_attention_traces_to_the_kernel_cpu_chooses():
    """Compiled npu attention runs the algorithm compiled CPU runs (the fused CPU flash kernel here), not the
    math decomposition the device stub answers for fake tensors (which made compiled npu 0.67x compiled CPU)."""
    from torch._inductor.utils import run_and_get_code
    from torch.nn.attention import SDPBackend

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    cpu_choice = torch._fused_sdp_choice(q, k, v, None, 0.0, True)
    assert cpu_choice == int(SDPBackend.FLASH_ATTENTION)  # what CPU picks for this layout on this build
    qn, kn, vn = (t.detach().npu().requires_grad_() for t in (q, k, v))

    def attn(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=True).square().sum()

    torch._dynamo.reset()
    out, sources = run_and_get_code(lambda: torch.compile(attn)(qn, kn, vn).backward())
    assert any("_scaled_dot_product_flash_attention_for_cpu.default" in s for s in sources)
    assert any("_scaled_dot_product_flash_attention_for_cpu_backward" in s for s in sources)
    attn(q, k, v).backward()
    for got, want in ((qn, q), (kn, k), (vn, v)):
        _assert_close(got.grad, want.grad.npu())
