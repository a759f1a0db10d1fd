"""torch.compile(backend="npugraphs"): AOTAutograd graphs replayed as NPUGraphs, same results as eager."""
import warnings

import torch
import torch._dynamo

from npudist.compile import npugraphs


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).npu()


def test_npugraphs_backend_trains_like_eager(monkeypatch):
    torch._dynamo.reset()
    replays = []
    real_call = npugraphs._Captured.__call__
    monkeypatch.setattr(npugraphs._Captured, "__call__", lambda self, args: replays.append(1) or real_call(self, args))
    data = [(torch.randn(4, 8).npu(), torch.randn(4, 4).npu()) for _ in range(3)]
    results = []
    for compiled in (False, True):
        model = _model()
        step = torch.compile(model, backend="npugraphs") if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in data:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(step(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach().cpu())
        results.append((losses, [p.detach().cpu() for p in model.parameters()]))
    for a, b in zip(results[0], results[1]):
        for ta, tb in zip(a, b):
            assert torch.equal(ta, tb)
    assert len(replays) >= 4  # forward and backward graphs replayed on steps 2 and 3


def test_outputs_are_not_overwritten_by_later_calls():
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 2).sin(), backend="npugraphs")
    a_in, b_in = torch.randn(5, device="npu"), torch.randn(5, device="npu")
    a = f(a_in)
    b = f(b_in)
    c = f(a_in)
    assert torch.equal(a.cpu(), (a_in * 2).sin().cpu()) and torch.equal(b.cpu(), (b_in * 2).sin().cpu())
    assert torch.equal(a.cpu(), c.cpu())


def test_graph_that_cannot_be_captured_runs_eagerly_with_a_warning():
    torch._dynamo.reset()

    def f(x, idx):
        return x[idx] * 2  # a CPU index tensor: a host read at launch, not capturable

    x, idx = torch.tensor([1.0, -1.0, 2.0], device="npu"), torch.tensor([2, 0])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = torch.compile(f, backend="npugraphs")(x, idx)
    assert torch.equal(out.cpu(), f(x, idx).cpu())
    assert any("without NPUGraph" in str(m.message) and "CPU tensor" in str(m.message) for m in w)
