"""torch.compile(backend="npugraph_ex"): passes, pattern replacement, NPUGraph replay and counters (docs/graphs.md)."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import torch.npu.npugraph_ex as npugraph_ex
from npudist.compile.npugraph_ex import backend, patterns
from npudist.models.config import ModelConfig
from npudist.models.llama import TransformerBlock, compute_rope_cache

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _fresh():
    npugraph_ex.register()  # the entry point, where the installed package metadata predates it
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _stats():
    return dict(counters["npugraph_ex"])


def _block():
    torch.manual_seed(0)
    cfg = ModelConfig(dim=32, n_heads=4, ffn_hidden_dim=64, max_seq_len=16)
    block = TransformerBlock(0, cfg)
    block.init_weights()
    cos, sin = compute_rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
    return block.npu(), cos[:8].npu(), sin[:8].npu()


def test_transformer_block_trains_like_eager():
    data = [torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(i)).npu() for i in range(3)]
    results = []
    for compiled in (False, True):
        block, cos, sin = _block()
        step = torch.compile(block, backend="npugraph_ex") if compiled else block
        opt = torch.optim.SGD(block.parameters(), lr=0.1)
        losses = []
        for x in data:
            opt.zero_grad()
            loss = step(x, cos, sin).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach().cpu())
        results.append((losses, [p.detach().cpu() for p in block.parameters()]))
    for want, got in zip(*results):
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    stats = _stats()
    assert stats["graphs"] == 2 and stats["captures"] == 2  # forward and backward, captured once each
    assert stats["replays"] == 4  # both replayed on steps 2 and 3


def test_transformer_block_inference_equals_eager_and_recaptures_on_shape_change():
    block, cos, sin = _block()
    compiled = torch.compile(block, backend="npugraph_ex", dynamic=False)
    with torch.no_grad():
        for batch in (2, 2, 3, 3):
            x = torch.randn(batch, 8, 32).npu()
            torch.testing.assert_close(compiled(x, cos, sin).cpu(), block(x, cos, sin).cpu(), rtol=1e-5, atol=1e-6)
    stats = _stats()
    # dynamic=False: Dynamo compiles a second graph for batch 3 (its own first capture).
    assert stats["captures"] == 2 and stats["replays"] == 2


def test_same_graph_recaptures_on_a_new_shape_and_counts_it():
    from npudist.compile.npugraph_ex.capture import CountedGraph

    graphed = CountedGraph(lambda args: [args[0] * 2], (), ())
    for n in (3, 3, 4):
        x = torch.arange(n, dtype=torch.float32, device="npu")
        assert torch.equal(graphed([x])[0].cpu(), (x * 2).cpu())
    assert _stats() == {"captures": 1, "replays": 1, "recaptures_shape": 1}


def _mutating(x, y):
    x.mul_(2)  # functionalized by AOTAutograd into mul + copy_ back into x
    return x + y


def test_input_mutation_is_restored_in_place_and_written_to_the_callers_tensor():
    compiled = torch.compile(_mutating, backend="npugraph_ex")
    x, y = torch.ones(4, device="npu"), torch.arange(4.0, device="npu")
    outs = [compiled(x, y).cpu() for _ in range(3)]
    assert torch.equal(x.cpu(), torch.full((4,), 8.0))  # every replay wrote the caller's x
    assert [o.tolist() for o in outs] == [[2, 3, 4, 5], [4, 5, 6, 7], [8, 9, 10, 11]]
    other = torch.ones(4, device="npu")
    assert torch.equal(compiled(other, y).cpu(), torch.tensor([2.0, 3, 4, 5])) and torch.equal(other.cpu(), 2 * torch.ones(4))
    stats = _stats()
    assert stats["inputs_reinplaced"] == 1 and stats["recaptures_input_mutation"] == 1


def _aot_graph(fn, *args, options):
    """The graph npugraph_ex captures for ``fn`` (after the passes in ``options``)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    graphs = []

    def keep(gm, inputs):
        backend.optimize(gm, backend._check_options(options))
        graphs.append(gm)
        return boxed_nop(gm, inputs)

    torch.compile(fn, backend=aot_autograd(fw_compiler=keep, keep_inference_input_mutations=True))(*args)
    torch._dynamo.reset()
    return graphs[0]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


OFF = {"pattern_fusion_pass": False, "remove_noop_ops": False, "input_inplace_pass": False}


def test_reinplace_pass_turns_the_copy_back_into_the_inplace_op():
    x, y = torch.ones(4, device="npu"), torch.ones(4, device="npu")
    without = _targets(_aot_graph(_mutating, x.clone(), y, options=OFF))
    with_pass = _targets(_aot_graph(_mutating, x.clone(), y, options={**OFF, "input_inplace_pass": True}))
    assert torch.ops.aten.copy_.default in without and torch.ops.aten.mul.Tensor in without
    assert torch.ops.aten.copy_.default not in with_pass and torch.ops.aten.mul_.Tensor in with_pass


def test_reinplace_pass_only_where_the_old_value_is_not_read_afterwards():
    def g(x):
        old = x * 1  # reads x before the update: fine
        x.copy_(x.sin())
        return old + x.cos()

    def k(x):
        s, c = x.sin(), x.cos()  # cos reads x's old value after sin: sin cannot write x
        x.copy_(s)
        return c

    on = {**OFF, "remove_noop_ops": True, "input_inplace_pass": True}
    x = torch.randn(4, device="npu")
    assert torch.ops.aten.sin_.default in _targets(_aot_graph(g, x.clone(), options=on))
    kept = _targets(_aot_graph(k, x.clone(), options=on))
    assert torch.ops.aten.copy_.default in kept and torch.ops.aten.sin_.default not in kept
    for fn in (g, k):
        compiled = torch.compile(fn, backend=backend.backend_with(on))
        a, b = x.clone(), x.clone()
        for _ in range(2):  # capture, then replay
            torch.testing.assert_close(compiled(a).cpu(), fn(b).cpu())
            assert torch.equal(a.cpu(), b.cpu())
        torch._dynamo.reset()


def test_noop_pass_removes_same_shape_views_clones_and_single_cats():
    def f(x):
        return torch.cat([x.view(4, 4).clone()]).reshape(4, 4).sin()

    x = torch.randn(4, 4, device="npu")
    without = _targets(_aot_graph(f, x, options=OFF))
    with_pass = _targets(_aot_graph(f, x, options={**OFF, "remove_noop_ops": True}))
    assert {torch.ops.aten.cat.default, torch.ops.aten.clone.default} <= set(without)
    assert with_pass == [torch.ops.aten.sin.default]
    out = torch.compile(f, backend="npugraph_ex")(x)
    assert torch.equal(out.cpu(), f(x).cpu()) and _stats()["noops_removed"] >= 2


def _search(x):
    return x * torch.sigmoid(x)


def _replace(x):
    return torch.nn.functional.silu(x)


def test_registered_replacement_fires_and_is_visible_in_the_graph(monkeypatch):
    monkeypatch.setattr(patterns, "_pass", None)  # a pattern registry of this test's own
    assert npugraph_ex.register_replacement(_search, _replace, [torch.randn(8)])

    def f(x, w):
        h = x @ w
        return h * torch.sigmoid(h) + 1

    x, w = torch.randn(4, 8, device="npu"), torch.randn(8, 8, device="npu")
    gm = _aot_graph(f, x, w, options={**OFF, "pattern_fusion_pass": True})
    assert torch.ops.aten.silu.default in _targets(gm) and torch.ops.aten.sigmoid.default not in _targets(gm)
    counters.clear()
    torch.testing.assert_close(torch.compile(f, backend="npugraph_ex")(x, w).cpu(), f(x, w).cpu())
    assert _stats()["pattern_replacements"] == 1
    off = _aot_graph(f, x, w, options=OFF)
    assert torch.ops.aten.sigmoid.default in _targets(off)


def test_extra_check_can_refuse_a_match(monkeypatch):
    monkeypatch.setattr(patterns, "_pass", None)
    npugraph_ex.register_replacement(_search, _replace, [torch.randn(8)], extra_check=lambda match: False)
    gm = _aot_graph(lambda x: x * torch.sigmoid(x), torch.randn(4, device="npu"), options=backend.OPTIONS)
    assert torch.ops.aten.silu.default not in _targets(gm)


def test_bad_options_and_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown option"):
        backend.backend_with({"reinplace": True})
    backend._reported.clear()
    with pytest.warns(UserWarning, match="without effect in npudist: capture_limit"):
        backend.backend_with({"capture_limit": 8})
    with pytest.raises(ValueError, match="example_inputs is empty"):
        npugraph_ex.register_replacement(_search, _replace, [])


def test_public_module_names():
    import torch_npu

    assert torch_npu.npu.npugraph_ex is npugraph_ex and torch.npu.npugraph_ex is npugraph_ex
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("npugraph_ex") is backend.compile_fx


def test_graph_that_cannot_be_captured_runs_eagerly_and_is_counted():
    def f(x, idx):
        return x[idx] * 2  # a CPU index tensor: a host read at launch, not capturable

    x, idx = torch.tensor([1.0, -1.0, 2.0], device="npu"), torch.tensor([2, 0])
    compiled = torch.compile(f, backend="npugraph_ex")
    with pytest.warns(UserWarning, match="without NPUGraph"):
        first = compiled(x, idx)
    assert torch.equal(first.cpu(), f(x, idx).cpu()) and torch.equal(compiled(x, idx).cpu(), f(x, idx).cpu())
    stats = _stats()
    assert stats["captures"] == 1 and stats["eager_runs"] == 1 and "replays" not in stats
