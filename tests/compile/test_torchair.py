"""torch_npu.dynamo.torchair: CompilerConfig's three modes run the same model equal to eager (docs/graphs.md)."""
import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from npudist.compile import torchair_config

pytestmark = pytest.mark.timeout(600)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 4)).npu()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(torchair_config, "_reported", set())
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead", "npugraph_ex"])
def test_each_mode_trains_like_eager(mode, monkeypatch):
    from npudist.compile import npugraphs
    from torch_npu.dynamo import torchair

    replays = []
    real_call = npugraphs._Captured.__call__
    monkeypatch.setattr(npugraphs._Captured, "__call__", lambda self, args: replays.append(1) or real_call(self, args))

    config = torchair.CompilerConfig()
    config.mode = mode
    backend = torchair.get_npu_backend(compiler_config=config)
    data = [(torch.randn(4, 8).npu(), torch.randn(4, 4).npu()) for _ in range(3)]
    results = []
    for compiled in (False, True):
        model = _model()
        step = torch.compile(model, backend=backend) if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in data:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(step(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach().cpu())
        results.append(losses + [p.detach().cpu() for p in model.parameters()])
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # Each mode reached its own backend.
    if mode == "max-autotune":  # Inductor generated the matmuls; nothing was captured
        assert "npugraph_ex" not in counters and counters["aten_mm_info"] and not replays
    elif mode == "npugraph_ex":
        assert counters["npugraph_ex"]["graphs"] == 2 and counters["npugraph_ex"]["replays"] == 4
    else:  # npugraphs: forward and backward replayed on steps 2 and 3
        assert "npugraph_ex" not in counters and not counters["aten_mm_info"] and len(replays) == 4


def test_mode_is_validated_and_unknown_names_refused():
    from torch_npu.dynamo.torchair import CompilerConfig

    config = CompilerConfig()
    with pytest.raises(ValueError, match="mode must be one of"):
        config.mode = "fast"
    with pytest.raises(AttributeError, match="no option 'modes'"):
        config.modes = "npugraph_ex"
    with pytest.raises(TypeError):
        torch.compile(torch.sin, backend=__import__("torch_npu.dynamo.torchair").dynamo.torchair.get_npu_backend(
            compiler_config={"mode": "npugraph_ex"}))


def test_options_without_meaning_are_reported_once_and_pass_switches_are_honored():
    from npudist.compile.npugraph_ex import backend as ngx
    from torch_npu.dynamo.torchair import CompilerConfig, get_npu_backend

    config = CompilerConfig()
    config.mode = "npugraph_ex"
    config.ge_config.enable_single_stream = True
    config.debug.aclgraph.disable_reinplace_input_mutated_ops_pass = True
    config.experimental_config.remove_noop_ops = False
    assert config.ge_config.enable_single_stream is True
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        backend = get_npu_backend(compiler_config=config)
        get_npu_backend(compiler_config=config)
    reports = [str(m.message) for m in w if "without effect" in str(m.message)]
    assert len(reports) == 1 and "ge_config.enable_single_stream" in reports[0]
    assert "remove_noop_ops" not in reports[0]
    assert backend.keywords["options"] == {**ngx.OPTIONS, "input_inplace_pass": False, "remove_noop_ops": False}


def test_torchair_module_names_and_npu_backend():
    import torch_npu.dynamo  # installs torchair as a top-level module, as torch_npu does
    import torchair

    assert torchair is torch_npu.dynamo.torchair
    from torch._dynamo.backends.registry import lookup_backend

    from npudist.compile.torchair import npu_backend

    assert lookup_backend("npu") is npu_backend


@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex"])
def test_get_compiler_compiles_aot_graphs(mode):
    from torch._dynamo.backends.common import aot_autograd
    from torch_npu.dynamo.torchair import CompilerConfig, get_compiler

    config = CompilerConfig()
    config.mode = mode
    compiler = get_compiler(config)
    model = _model()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=compiler, bw_compiler=compiler))
    x = torch.randn(4, 8).npu()
    for _ in range(2):
        compiled(x).sum().backward()
        want = model(x).sum()
        torch.testing.assert_close(compiled(x).sum(), want)
    if mode == "npugraph_ex":
        assert counters["npugraph_ex"]["replays"] >= 3
