"""Super kernels (docs/graphs.md, "Super kernels"): torch.npu.super_kernel_scope_begin / _end mark scopes during an
NPUGraph capture, NPUGraph.super_kernel_optimize fuses each scope into one task, replays stay bitwise equal to eager;
pairing, name and option errors; the scope ops under torch.compile."""
import re

import pytest
import torch


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 8, generator=g).npu() for _ in range(3)]


def _body(x, w, y):
    a = torch.mm(x, w.t())             # outside the scopes
    torch.npu.super_kernel_scope_begin("first")
    b = torch.relu(a)
    c = b * a
    d = c + a                          # scope "first": relu, mul, add
    torch.npu.super_kernel_scope_end("first")
    e = d.sum(0)
    torch.npu.super_kernel_scope_begin()
    f = torch.exp(e)
    h = f - e                          # the unnamed scope: exp, sub
    torch.npu.super_kernel_scope_end()
    return h, torch.tanh(y)


def _refill(statics, seed):
    for s, n in zip(statics, _inputs(seed)):
        s.copy_(n)


def _dump(g, tmp_path):
    path = tmp_path / "graph.txt"
    g.debug_dump(str(path))
    return path.read_text()


def test_two_scopes_fuse_into_one_task_each_and_replay_matches_eager(tmp_path):
    statics = _inputs()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        outs = _body(*statics)
    assert g.num_super_kernel_scopes() == 2
    before = g.num_tasks()
    _refill(statics, 1)
    g.replay()
    assert all(torch.equal(o.cpu(), e.cpu()) for o, e in zip(outs, _body(*statics)))

    g.super_kernel_optimize()
    # Scope "first" had 3 tasks, the unnamed one 2: each is now one task.
    assert g.num_tasks() == before - (3 - 1) - (2 - 1)
    assert g.num_super_kernel_scopes() == 0
    dump = _dump(g, tmp_path)
    assert "super kernel of scope 'first': 3 sub-kernels" in dump and "super kernel of scope None: 2 sub-kernels" in dump
    for seed in (2, 3):
        _refill(statics, seed)
        g.replay()
        expected = _body(*statics)
        assert all(torch.equal(o.cpu(), e.cpu()) for o, e in zip(outs, expected))
    g.reset()


def _independent(x, w, y):
    torch.npu.super_kernel_scope_begin("par")
    a = torch.sin(x)
    b = torch.cos(w)                   # independent of a: may run with it
    c = torch.tanh(y)
    d = a + b                          # reads a and b: after them
    torch.npu.super_kernel_scope_end("par")
    return c, d


@pytest.mark.parametrize("sync_all", [0, 1])
def test_debug_sync_all_synchronizes_after_every_sub_kernel(tmp_path, sync_all):
    statics = _inputs()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        outs = _independent(*statics)
    g.super_kernel_optimize(debug_options={"debug_sync_all": sync_all})
    assert g.num_tasks() == 1
    waves = int(re.search(r"4 sub-kernels, (\d+) waves", _dump(g, tmp_path)).group(1))
    # Without debug_sync_all sin, cos and tanh share a wave and the add waits for it; with it, every sub-kernel
    # is joined before the next starts.
    assert waves == (4 if sync_all else 2)
    _refill(statics, 5)
    g.replay()
    assert all(torch.equal(o.cpu(), e.cpu()) for o, e in zip(outs, _independent(*statics)))


def test_an_in_place_write_waits_for_the_reads_before_it(tmp_path):
    x, w, _ = _inputs()
    x0 = x.clone()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.npu.super_kernel_scope_begin("hazard")
        a = torch.sin(x)
        x.mul_(2)                      # writes what sin read: a later wave
        b = torch.cos(w)               # independent: joins mul_'s wave
        c = a + x                      # reads both: the wave after
        torch.npu.super_kernel_scope_end("hazard")
    g.super_kernel_optimize()
    assert re.search(r"4 sub-kernels, 3 waves", _dump(g, tmp_path))
    for _ in range(2):
        x.copy_(x0)
        g.replay()
        assert torch.equal(a.cpu(), x0.sin().cpu()) and torch.equal(x.cpu(), (x0 * 2).cpu())
        assert torch.equal(b.cpu(), w.cos().cpu()) and torch.equal(c.cpu(), (x0.sin() + x0 * 2).cpu())


def test_random_ops_in_a_scope_draw_like_eager():
    x = torch.zeros(64, device="npu")

    def step():
        torch.npu.super_kernel_scope_begin("rand")
        a = torch.nn.functional.dropout(x + 1, p=0.5)
        b = torch.rand_like(x)
        c = a * b
        torch.npu.super_kernel_scope_end("rand")
        return c

    torch.npu.manual_seed(11)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        out = step()
    g.super_kernel_optimize()
    replays = []
    for _ in range(2):
        g.replay()
        replays.append(out.cpu())
    torch.npu.manual_seed(11)
    eager = [step().cpu() for _ in range(3)]
    assert torch.equal(replays[0], eager[1]) and torch.equal(replays[1], eager[2])


def _capture_error(fn):
    g = torch.npu.NPUGraph()
    x = torch.ones(4, device="npu")
    with pytest.raises(RuntimeError) as info:
        with torch.npu.graph(g):
            fn(x)
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.super_kernel_optimize()  # the failed capture was discarded
    return str(info.value)


def test_begin_without_end_fails_the_capture_naming_the_scope():
    def fn(x):
        torch.npu.super_kernel_scope_begin("left_open")
        x.add_(1)
    msg = _capture_error(fn)
    assert "super_kernel_scope_begin was called without a matching super_kernel_scope_end" in msg
    assert "'left_open'" in msg


def test_end_without_begin_fails_the_capture_naming_the_scopes():
    def fn(x):
        torch.npu.super_kernel_scope_begin("a")
        x.add_(1)
        torch.npu.super_kernel_scope_end("b")  # pairs by name: no scope "b" is open
        torch.npu.super_kernel_scope_end("a")
    msg = _capture_error(fn)
    assert "super_kernel_scope_end(scope_name='b') has no matching super_kernel_scope_begin" in msg
    assert "['a']" in msg


def test_scopes_pair_by_name_in_any_order():
    statics = _inputs()
    x = statics[0]

    def fn():
        torch.npu.super_kernel_scope_begin("a")
        a = x.sin()
        b = a.cos()
        torch.npu.super_kernel_scope_begin("b")
        c = b.exp()
        torch.npu.super_kernel_scope_end("a")   # "a" ends before "b": overlapping scopes fuse together
        d = c.neg()
        torch.npu.super_kernel_scope_end("b")
        return d

    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        out = fn()
    assert g.num_super_kernel_scopes() == 2
    before = g.num_tasks()
    g.super_kernel_optimize()
    assert g.num_tasks() == before - 3
    _refill(statics, 4)
    g.replay()
    assert torch.equal(out.cpu(), fn().cpu())


@pytest.mark.parametrize("bad", ["", "   "])
def test_scope_name_must_be_none_or_non_empty(bad):
    for op in (torch.npu.super_kernel_scope_begin, torch.npu.super_kernel_scope_end):
        with pytest.raises(RuntimeError, match="scope_name should be None or a non-empty string."):
            op(bad)
    # Outside a capture a valid call only checks its argument.
    torch.npu.super_kernel_scope_begin("x")
    torch.npu.super_kernel_scope_end(None)
    with pytest.raises(RuntimeError):
        torch.ops.npu.super_kernel_scope_begin(3)


def test_optimize_needs_a_successful_capture_and_runs_once():
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match=re.escape("Called NPUGraph::super_kernel_optimize without a preceding "
                                                     "successful capture.")):
        g.super_kernel_optimize()
    statics = _inputs()
    with torch.npu.graph(g):
        _independent(*statics)
    g.super_kernel_optimize()
    with pytest.raises(RuntimeError, match="already fused"):
        g.super_kernel_optimize()
    g.reset()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.super_kernel_optimize()


@pytest.mark.parametrize("kwargs, message", [
    ({"optimize_options": [1]}, "optimize_options param must be dict or None."),
    ({"debug_options": "x"}, "debug_options param must be dict or None."),
    ({"optimize_options": {"no_such": 1}}, "Invalid optimize_options param key: 'no_such'."),
    ({"debug_options": {"preload_code": 1}}, "Invalid debug_options param key: 'preload_code'."),
    ({"optimize_options": {"split_mode": "1"}}, "optimize_options param['split_mode'] must be int, got str"),
    ({"optimize_options": {"opt_extend": 1}}, "optimize_options param['opt_extend'] must be str, got int"),
    ({"optimize_options": {"dcci_after_kernel_end": ["a", 2]}},
     "optimize_options['dcci_after_kernel_end'][1] must be str, got int"),
    ({"optimize_options": {"aggressive_opt_strategies": {"x": 1}}},
     "Invalid sub_key 'x' in optimize_options['aggressive_opt_strategies']."),
    ({"optimize_options": {"aggressive_opt_strategies": {"task_breaker_bypass": 1.0}}},
     "optimize_options['aggressive_opt_strategies']['task_breaker_bypass'] must be int, got float"),
    ({"debug_options": {"debug_sync_all": None}}, "debug_options param['debug_sync_all'] must be int, got NoneType"),
])
def test_options_are_validated_like_torch_npu(kwargs, message):
    statics = _inputs()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        _independent(*statics)
    before = g.num_tasks()
    with pytest.raises(RuntimeError, match=re.escape(message)):
        g.super_kernel_optimize(**kwargs)
    assert g.num_tasks() == before  # nothing fused
    g.super_kernel_optimize(
        optimize_options={"preload_code": 1, "split_mode": 0, "stream_fusion": 1, "constant_codegen": 1,
                          "auto_op_parallel": 1, "opt_extend": "", "dcci_before_kernel_start": ["k"],
                          "dcci_after_kernel_end": [], "dcci_disable_on_kernel": [], "ubuf_lock_ignore_kernel": [],
                          "early_start": 1, "aggressive_opt_strategies": {"value_breaker_bypass": 0}},
        debug_options={"debug_op_exec_trace": 0, "debug_cross_core_sync_check": 0, "debug_extend": "",
                       "debug_per_op_max_core_num": 8})
    assert g.num_tasks() == 1


@pytest.mark.parametrize("bypass", [0, 1])
def test_an_event_wait_ends_the_super_kernel_unless_bypassed(bypass):
    x = _inputs()[0]
    event = torch.npu.ExternalEvent()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        stream = torch.npu.current_stream()
        torch.npu.super_kernel_scope_begin("ev")
        a = x.sin()
        event.wait(stream)
        event.reset(stream)
        b = a.cos()
        torch.npu.super_kernel_scope_end("ev")
    assert g.num_tasks() == 4
    g.super_kernel_optimize(optimize_options={"aggressive_opt_strategies": {"event_breaker_bypass": bypass}})
    # Default: [sin] [wait] [reset + cos]; bypassed: one super kernel.
    assert g.num_tasks() == (1 if bypass else 3)
    x.copy_(_inputs(6)[0])
    event.record(torch.npu.current_stream())
    g.replay()
    assert torch.equal(b.cpu(), x.sin().cos().cpu())
    assert not event.query()  # the replay's reset ran after its wait


def test_task_group_tasks_stay_separate_and_update_after_optimize():
    x, w, y = _inputs()
    y2 = _inputs(8)[2]
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        stream = torch.npu.current_stream()
        torch.npu.super_kernel_scope_begin("grouped")
        a = (x * w).sin()
        torch.npu.graph_task_group_begin(stream)
        b = a + y
        handle = torch.npu.graph_task_group_end(stream)
        c = b.relu().exp()
        torch.npu.super_kernel_scope_end("grouped")
    before = g.num_tasks()
    g.super_kernel_optimize()
    assert g.num_tasks() == before - 2  # [mul + sin] [add] [relu + exp]
    update_stream = torch.npu.Stream()
    with torch.npu.stream(update_stream):
        torch.npu.graph_task_update_begin(update_stream, handle)
        a + y2
        torch.npu.graph_task_update_end(update_stream)
    torch.npu.current_stream().wait_stream(update_stream)
    g.replay()
    assert torch.equal(c.cpu(), ((x * w).sin() + y2).relu().exp().cpu())


def _scoped(x):
    torch.npu.super_kernel_scope_begin("compiled")
    y = torch.sin(x) * 2
    torch.npu.super_kernel_scope_end("compiled")
    return y + 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_keeps_the_scope_ops_in_the_graph(backend):
    from torch._dynamo.backends.registry import lookup_backend
    torch._dynamo.reset()
    seen = []

    def recording(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if "super_kernel" in str(n.target))
        return lookup_backend(backend)(gm, example_inputs)

    compiled = torch.compile(_scoped, backend=recording, fullgraph=True)
    x = _inputs()[0]
    assert torch.equal(compiled(x).cpu(), _scoped(x).cpu())
    assert seen == ["npu.super_kernel_scope_begin", "npu.super_kernel_scope_end"]
    # The compiled function's scope reaches a capture around it.
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        out = compiled(x)
    assert g.num_super_kernel_scopes() == 1
    before = g.num_tasks()
    g.super_kernel_optimize()
    assert g.num_tasks() == before - 1
    x.copy_(_inputs(9)[0])
    g.replay()
    assert torch.equal(out.cpu(), _scoped(x).cpu())


def test_inductor_keeps_the_scope_ops():
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    x = _inputs()[0]
    out, codes = run_and_get_code(torch.compile(_scoped, backend="inductor", fullgraph=True), x)
    torch.testing.assert_close(out.cpu(), _scoped(x).cpu())
    calls = [line.strip() for code in codes for line in code.splitlines() if "super_kernel_scope" in line and
             not line.strip().startswith("#")]
    assert calls == ["torch.ops.npu.super_kernel_scope_begin.default('compiled')",
                     "torch.ops.npu.super_kernel_scope_end.default('compiled')"]
