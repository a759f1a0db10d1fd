"""NPUGraph capture and replay (docs/graphs.md): replay equals eager bitwise, static inputs, errors, memory."""
import gc
import threading

import pytest
import torch

import torch_npu  # noqa: F401  (torch_npu.npu.* names)


def _block(x, w1, w2, ln):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), ln)
    h = torch.nn.functional.gelu(h @ w1)
    return x + torch.softmax(h @ w2, dim=-1) * 0.5


def _weights(d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(d, 4 * d, generator=g).npu()
    w2 = torch.randn(4 * d, d, generator=g).npu()
    ln = torch.randn(d, generator=g).npu()
    return w1, w2, ln


def test_replay_equals_eager_bitwise_and_follows_static_inputs():
    w1, w2, ln = _weights()
    static_x = torch.randn(8, 16).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        static_out = _block(static_x, w1, w2, ln)
    assert g.num_tasks() > 5
    for seed in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed)).npu()
        static_x.copy_(x)
        static_out.zero_()
        g.replay()
        assert torch.equal(static_out.cpu(), _block(x, w1, w2, ln).cpu())
    # The eager reference on CPU too: npu is bitwise CPU, so replay is as well.
    assert torch.equal(static_out.cpu(), _block(x.cpu(), w1.cpu(), w2.cpu(), ln.cpu()))


def test_in_place_ops_out_variants_and_copies_replay():
    a = torch.arange(6.0).npu()
    out = torch.empty(6, device="npu")
    acc = torch.zeros(6, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.mul(a, 2, out=out)
        acc.add_(out)
        b = a.view(2, 3).t().contiguous()  # a copy of a view: strided copy kernel
    assert acc.cpu().tolist() == [0, 2, 4, 6, 8, 10]  # kernels also run during capture (docs/graphs.md)
    a.fill_(1.0)
    g.replay()
    assert out.cpu().tolist() == [2.0] * 6 and acc.cpu().tolist() == [2, 4, 6, 8, 10, 12]
    assert torch.equal(b.cpu(), torch.ones(3, 2))
    g.replay()
    assert acc.cpu().tolist() == [4, 6, 8, 10, 12, 14]


def test_random_ops_advance_the_generator_like_eager():
    x = torch.zeros(1000, device="npu")
    torch.npu.manual_seed(7)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = torch.nn.functional.dropout(x + 1, p=0.5)
    replays = []
    for _ in range(2):
        g.replay()
        replays.append(y.cpu())
    torch.npu.manual_seed(7)
    eager = [torch.nn.functional.dropout(x + 1, p=0.5).cpu() for _ in range(3)]
    assert torch.equal(replays[0], eager[1]) and torch.equal(replays[1], eager[2])
    assert not torch.equal(replays[0], replays[1])


def test_make_graphed_callables_trains_like_eager():
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                   torch.nn.Linear(16, 4)).npu()

    data = [(torch.randn(4, 8).npu(), torch.randn(4, 4).npu()) for _ in range(4)]
    eager, graphed = build(), build()
    graphed = torch.npu.make_graphed_callables(graphed, (torch.randn(4, 8, device="npu"),))
    results = []
    for model in (eager, graphed):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach().cpu())
        results.append((losses, [p.detach().cpu() for p in model.parameters()],
                        [p.grad.cpu() for p in model.parameters()]))
    for a, b in zip(results[0], results[1]):
        for ta, tb in zip(a, b):
            assert torch.equal(ta, tb)


def test_make_graphed_callables_function_with_input_grad():
    w = torch.randn(5, 5, device="npu")

    def f(x):
        return (x @ w).tanh()

    x = torch.randn(3, 5, device="npu", requires_grad=True)
    gf = torch.npu.make_graphed_callables(f, (torch.randn(3, 5, device="npu", requires_grad=True),))
    gf(x).sum().backward()
    gx = x.grad.clone()
    x.grad = None
    f(x).sum().backward()
    assert torch.equal(gx, x.grad)
    with pytest.raises(TypeError, match="only Tensors"):
        torch.npu.make_graphed_callables(f, (3,))


# Every refusal carries CANN's code for an operation the capture mode does not support (what Ascend users search for).
@pytest.mark.parametrize("action, what", [
    (lambda t: torch.npu.synchronize(), "torch.npu.synchronize"),
    (lambda t: t.sum().item(), "item"),
    (lambda t: t.cpu(), "to the host"),
    (lambda t: torch.npu.current_stream().synchronize(), "Stream.synchronize"),
    (lambda t: torch.npu.current_stream().record_event().synchronize(), "Event.synchronize"),
    (lambda t: torch.nonzero(t), "aten::nonzero"),
    (lambda t: t[torch.tensor([0, 2])], "CPU tensor"),
])
def test_not_permitted_during_capture(action, what):
    t = torch.ones(4, device="npu")
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match=what) as info:
        with torch.npu.graph(g):
            t.mul_(2)
            action(t)
    assert "capturing" in str(info.value)
    assert "ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, error code 107030" in str(info.value)
    assert not torch.npu.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="has not been captured"):
        g.replay()
    torch.npu.synchronize()  # allowed again


def test_capture_on_default_stream_and_bad_arguments_raise():
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()
    with pytest.raises(ValueError, match="capture_error_mode"):
        torch.npu.graph(g, capture_error_mode="strict")
    with pytest.raises(ValueError, match="pool"):
        with torch.npu.stream(torch.npu.Stream()):
            g.capture_begin(pool="mine")


def test_capture_error_modes_for_other_threads():
    def other_thread_sync():
        errors = []

        def run():
            try:
                torch.npu.synchronize()
            except RuntimeError as e:
                errors.append(str(e))
        th = threading.Thread(target=run)
        th.start()
        th.join(timeout=30)
        assert not th.is_alive()
        return errors

    results = {}
    for mode in ("global", "thread_local", "relaxed"):
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, capture_error_mode=mode):
            assert torch.npu.is_current_stream_capturing()
            results[mode] = other_thread_sync()
    assert len(results["global"]) == 1 and "capture_error_mode='global'" in results["global"][0]
    assert results["thread_local"] == [] and results["relaxed"] == []


def test_pool_reset_and_no_leak_across_replays(tmp_path):
    gc.collect()  # torch.npu.graph collects garbage on entry: leftovers of earlier tests must not skew the baseline
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    x = torch.randn(64, 64, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = (x @ x).relu().sum(0)
    pool = g.pool()
    assert isinstance(pool, tuple) and pool != torch.npu.graph_pool_handle()
    after_capture = torch.npu.memory_allocated()
    for _ in range(50):
        g.replay()
    assert torch.npu.memory_allocated() == after_capture
    g.debug_dump(tmp_path / "graph.txt")
    dump = (tmp_path / "graph.txt").read_text()
    assert "aten::mm" in dump and "aten::relu" in dump and "copied into" in dump
    # Intermediates (x @ x) stay in the graph's pool until reset.
    del y
    assert torch.npu.memory_allocated() > base + x.numel() * 4
    g.reset()
    del x
    assert torch.npu.memory_allocated() == base
    with pytest.raises(RuntimeError, match="has not been captured"):
        g.replay()


def test_resizing_a_static_tensor_after_capture_raises():
    x = torch.ones(4, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = x * 2
    y.resize_(1000)
    with pytest.raises(RuntimeError, match="resized"):
        g.replay()


def test_torch_npu_names():
    for name in ("NPUGraph", "graph", "make_graphed_callables", "is_current_stream_capturing",
                 "graph_pool_handle"):
        assert getattr(torch_npu.npu, name) is getattr(torch.npu, name)


def test_make_graphed_callables_tuple_shares_a_pool_token():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 4).npu(), torch.nn.Linear(4, 2).npu()
    x = torch.randn(3, 4, device="npu")
    ref = b(a(x).relu())
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in (*a.parameters(), *b.parameters())]
    for p in (*a.parameters(), *b.parameters()):
        p.grad = None
    ga, gb = torch.npu.make_graphed_callables(
        (a, b), ((torch.randn(3, 4, device="npu"),), (torch.randn(3, 4, device="npu", requires_grad=True),)))
    out = gb(ga(x).relu())
    assert torch.equal(out, ref)
    out.sum().backward()
    for p, g in zip((*a.parameters(), *b.parameters()), ref_grads):
        assert torch.equal(p.grad, g)


def test_error_in_the_captured_body_propagates_and_resets_the_graph():
    g = torch.npu.NPUGraph()
    with pytest.raises(KeyError):
        with torch.npu.graph(g):
            torch.ones(2, device="npu").add_(1)
            raise KeyError("user error")
    assert not torch.npu.is_current_stream_capturing()
    with torch.npu.graph(g):  # the graph is reusable
        y = torch.ones(2, device="npu") * 3
    g.replay()
    assert y.tolist() == [3.0, 3.0]


def test_replay_dispatches_nothing_through_python():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    w1, w2, ln = _weights()
    x = torch.randn(8, 16, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = _block(x, w1, w2, ln)
    with Log() as log:
        g.replay()
        eager = _block(x, w1, w2, ln)
    assert len(log.ops) > 5  # all from the eager call
    with Log() as log:
        g.replay()
    assert log.ops == [] and torch.equal(y, eager)


def test_work_outside_the_fallback_invalidates_the_capture():
    """A custom op with its own npu kernel cannot be recorded: capture_end raises naming it."""
    lib = torch.library.Library("ngraph_test", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "PrivateUse1")
    x = torch.ones(3, device="npu")
    assert torch.ops.ngraph_test.twice(x).tolist() == [2.0] * 3
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="capture failed.*ngraph_test::twice.*outside the fallback"):
        with torch.npu.graph(g):
            torch.ops.ngraph_test.twice(x)
    with torch.npu.graph(g):  # the graph is reusable, and aten work is recorded as usual
        y = x * 3
    g.replay()
    assert y.tolist() == [3.0] * 3


def test_hccl_collective_invalidates_the_capture():
    import torch.distributed as dist

    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.ones(4, device="npu")
        g = torch.npu.NPUGraph()
        with pytest.raises(RuntimeError, match="c10d::allreduce_.*hccl collectives"):
            with torch.npu.graph(g):
                dist.all_reduce(t)
    finally:
        dist.destroy_process_group()


def test_composite_ops_sizing_an_empty_out_argument_replay():
    # torch.abs and torch.isinf run their out= overload on an empty result the CPU kernel sizes: the graph takes the
    # sized buffer, and a replay writes into it.
    x = torch.randn(4).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = torch.abs(x)
        z = torch.isinf(x)
    new = torch.tensor([-1.0, 2.0, float("-inf"), -4.0])
    x.copy_(new.npu())
    y.zero_()
    g.replay()
    assert torch.equal(y.cpu(), new.abs()) and torch.equal(z.cpu(), new.isinf())


def test_default_capture_stream_is_never_a_new_stream():
    """torch.npu.graph's default capture stream has an id of its own above torch's round-robin pool (as the
    sync-launch streams do): were it drawn from the pool, every 32nd torch.npu.Stream() would be it again."""
    x = torch.arange(4.0).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        capture = torch.npu.current_stream()
        y = x * 2
    assert capture == torch.npu.graph.default_capture_stream and type(capture) is torch.npu.Stream
    assert capture.stream_id != 0 and capture.priority == 0
    made = [torch.npu.Stream() for _ in range(70)] + [torch.npu.Stream(priority=-1) for _ in range(70)] + \
        [torch.npu.SyncLaunchStream() for _ in range(8)] + [torch.npu.Stream(is_sync_launch=1) for _ in range(8)]
    assert len({s.stream_id for s in made[:70]}) == 32  # the pool did wrap around (twice)
    assert not [s for s in made if s == capture or s.stream_id == capture.stream_id]
    # A stream of its own that works as any other: work on it is ordered, replay still follows the inputs.
    with torch.npu.stream(capture):
        z = x + 1
    torch.npu.current_stream().wait_stream(capture)
    x.fill_(5.0)
    g.replay()
    torch.npu.synchronize()
    assert torch.equal(z.cpu(), torch.arange(4.0) + 1) and torch.equal(y.cpu(), torch.full((4,), 10.0))
    # One per device: a capture on another device gets that device's stream of the same id.
    with torch.npu.device(1):
        g1 = torch.npu.NPUGraph()
        with torch.npu.graph(g1):
            other = torch.npu.current_stream()
            _ = torch.ones(2, device="npu:1") * 3
    assert other.device_index == 1 and other.stream_id == capture.stream_id and other != capture
