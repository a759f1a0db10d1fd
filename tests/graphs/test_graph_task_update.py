"""NPUGraph task groups and their updates (docs/graph_task_update.md): graph_task_group_begin/_end inside a capture,
graph_task_update_begin/_end after it, ExternalEvent ordering the update stream before the replay, and the errors."""
import gc

import pytest
import torch

import torch_npu
from npudist.device import graph_handlers


def _ifa(q, k, v, lengths):
    return torch_npu.npu_fused_infer_attention_score(
        q, k, v, num_heads=q.shape[1], input_layout="BNSD", scale=0.125, pre_tokens=65535, next_tokens=65535,
        softmax_lse_flag=False, actual_seq_lengths=lengths)[0]


def _qkv(seq=128):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 4, seq, 32, generator=g).npu() for _ in range(3)]


def test_fused_infer_attention_actual_seq_lengths_update_matches_eager():
    # torch_npu's documented flow: an event the graph waits on, a task group around the attention op, an update of
    # actual_seq_lengths on an update stream, the event recorded after the update, then the replay.
    q, k, v = _qkv()
    expected_29, expected_100 = _ifa(q, k, v, [29]), _ifa(q, k, v, [100])
    assert not torch.equal(expected_29.cpu(), expected_100.cpu())  # the lengths matter: rows past them are 0
    g = torch.npu.NPUGraph()
    event = torch.npu.ExternalEvent()
    update_stream = torch.npu.Stream()
    with torch.no_grad():
        with torch.npu.graph(g):
            stream = torch.npu.current_stream()
            event.wait(stream)
            event.reset(stream)
            torch.npu.graph_task_group_begin(stream)
            out = _ifa(q, k, v, [29])
            handle = torch.npu.graph_task_group_end(stream)
            after = out * 2  # a task after the group reads the group's result
    assert torch.equal(out.cpu(), expected_29.cpu())
    for lengths, expected in (([100], expected_100), ([29], expected_29)):
        with torch.npu.stream(update_stream):
            torch.npu.graph_task_update_begin(update_stream, handle)
            _ifa(q, k, v, lengths)
            torch.npu.graph_task_update_end(update_stream)
            event.record(update_stream)
        out.zero_()
        after.zero_()
        g.replay()
        assert torch.equal(out.cpu(), expected.cpu())
        assert torch.equal(after.cpu(), (expected * 2).cpu())


def test_scalar_argument_update_and_later_tasks_see_it():
    g, x, handle, _, y, z = _captured_group(lambda x: torch.mul(x, 3.0), torch.arange(8.0).npu(), lambda y: y + 1)
    update_stream = torch.npu.Stream()
    with torch.npu.stream(update_stream):
        torch.npu.graph_task_update_begin(update_stream, handle)
        assert torch.npu.is_current_stream_capturing()  # host synchronisation is refused here as in a capture
        with pytest.raises(RuntimeError, match="107030"):
            torch.npu.current_stream().synchronize()
        torch.mul(x, 5.0)
        torch.npu.graph_task_update_end(update_stream)
    assert not torch.npu.is_current_stream_capturing()
    torch.npu.current_stream().wait_stream(update_stream)
    g.replay()
    assert torch.equal(y.cpu(), torch.arange(8.0) * 5)
    assert torch.equal(z.cpu(), torch.arange(8.0) * 5 + 1)
    # A tensor argument can change too: the update's tensor replaces the captured one.
    x2 = torch.full((8,), 2.0).npu()
    with torch.npu.stream(update_stream):
        torch.npu.graph_task_update_begin(update_stream, handle)
        torch.mul(x2, 5.0)
        torch.npu.graph_task_update_end(update_stream)
    torch.npu.current_stream().wait_stream(update_stream)
    g.replay()
    assert torch.equal(z.cpu(), torch.full((8,), 11.0))
    assert g.num_task_groups() == 1


def _captured_group(ops, x=None, after=None):
    """A graph capturing `ops(x)` as its one task group, then `after(result)` outside the group:
    (graph, x, group handle, capture stream, the group's result, after's result)."""
    x = torch.arange(4.0).npu() if x is None else x
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        stream = torch.npu.current_stream()
        torch.npu.graph_task_group_begin(stream)
        result = ops(x)
        handle = torch.npu.graph_task_group_end(stream)
        later = after(result) if after is not None else None
    return g, x, handle, stream, result, later


def test_update_with_other_ops_is_refused_and_the_group_keeps_its_tasks():
    g, x, handle, *_ = _captured_group(lambda x: torch.mul(x, 2.0))
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        torch.npu.graph_task_update_begin(s, handle)
        torch.add(x, 1.0)
        with pytest.raises(ValueError, match=r"captured as aten::mul.*issued aten::add"):
            torch.npu.graph_task_update_end(s)
        torch.npu.graph_task_update_begin(s, handle)
        torch.mul(x, 2.0)
        torch.mul(x, 3.0)
        with pytest.raises(ValueError, match=r"recorded 1 tasks .*issued 2"):
            torch.npu.graph_task_update_end(s)
    g.replay()  # still the captured group
    torch.npu.synchronize()


def test_update_changing_the_shape_of_a_result_read_after_the_group_is_refused():
    g, x, handle, *_ = _captured_group(lambda x: x[:4] * 2, torch.arange(8.0).npu(), lambda y: y.add_(1))
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        torch.npu.graph_task_update_begin(s, handle)
        _ = x[:6] * 2
        with pytest.raises(ValueError, match="outside the group reads"):
            torch.npu.graph_task_update_end(s)


def test_group_misuse_errors():
    s = torch.npu.Stream()
    with pytest.raises(RuntimeError, match="not capturing an NPUGraph"):
        torch.npu.graph_task_group_begin(s)
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        stream = torch.npu.current_stream()
        with pytest.raises(RuntimeError, match="graph_task_group_end without graph_task_group_begin"):
            torch.npu.graph_task_group_end(stream)
        torch.npu.graph_task_group_begin(stream)
        with pytest.raises(RuntimeError, match="groups do not nest"):
            torch.npu.graph_task_group_begin(stream)
        torch.npu.graph_task_group_end(stream)
    g2 = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="without its graph_task_group_end"):
        with torch.npu.graph(g2):
            torch.npu.graph_task_group_begin(torch.npu.current_stream())
            torch.ones(2, device="npu") * 2
    with pytest.raises(ValueError, match="handle must be what graph_task_group_end returned"):
        torch.npu.graph_task_update_begin(s, 3)
    with pytest.raises(RuntimeError, match="is not updating a task group"):
        torch.npu.graph_task_update_end(s)
    with pytest.raises(ValueError, match="must be an npu stream"):
        torch.npu.graph_task_group_begin("stream")


def test_update_of_a_reset_or_deleted_graph_or_during_capture_is_refused():
    g, x, handle, capture_stream, *_ = _captured_group(lambda x: torch.mul(x, 2.0))
    s = torch.npu.Stream()
    with pytest.raises(RuntimeError, match="capture stream"):
        torch.npu.graph_task_update_begin(capture_stream, handle)
    g.reset()
    with pytest.raises(RuntimeError, match="earlier capture of this graph"):
        torch.npu.graph_task_update_begin(s, handle)
    g2, _, handle2, *_ = _captured_group(lambda x: torch.mul(x, 2.0))
    del g2
    gc.collect()
    with pytest.raises(RuntimeError, match="NPUGraph was deleted"):
        torch.npu.graph_task_update_begin(s, handle2)
    g3 = torch.npu.NPUGraph()
    with torch.npu.graph(g3):
        stream = torch.npu.current_stream()
        torch.npu.graph_task_group_begin(stream)
        torch.mul(x, 2.0)
        h3 = torch.npu.graph_task_group_end(stream)
        with pytest.raises(RuntimeError, match="still capturing"):
            torch.npu.graph_task_update_begin(s, h3)


def test_external_event_wait_before_record_orders_streams():
    event = torch.npu.ExternalEvent()
    assert not event.query()
    a, b = torch.npu.Stream(), torch.npu.Stream()
    x = torch.zeros(4, device="npu")
    torch.npu.synchronize()  # x's zero fill runs on the default stream: done before the side streams touch x
    if torch.npu.launch.is_blocking():
        # Synchronous launch: the wait would run on this thread, the only one that could record the event.
        with pytest.raises(RuntimeError, match="would block forever"):
            event.wait(a)
        event.record(b)
        event.wait(a)  # recorded: passes
        assert event.query()
        return
    with torch.npu.stream(b):
        x.fill_(1)  # b's work before its record
    event.wait(a)  # issued before the record: stream a holds until b records
    event.record(b)
    with torch.npu.stream(a):
        x.mul_(3)  # ordered after b's fill by the event alone
    torch.npu.synchronize()
    assert event.query() and torch.equal(x.cpu(), torch.full((4,), 3.0))
    event.reset(a)
    torch.npu.synchronize()
    assert not event.query()


def test_auto_dispatch_capture_update_through_a_registered_handler():
    @torch.npu.register_npu_graph_handler(["mul.Tensor"])
    class _MulHandler(torch.npu.NpuGraphOpHandler):
        UPDATE_SPECS = {"mul.Tensor": [("arg", 1, "factor")]}

    try:
        x = torch.arange(6.0).npu()
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, auto_dispatch_capture=True):
            y = torch.mul(x, 3.0)
            z = y + 1
        assert g.num_task_groups() == 1
        for factor in (5.0, -2.0):
            g.update([{"factor": factor}])
            g.replay()
            assert torch.equal(z.cpu(), torch.arange(6.0) * factor + 1)
        with pytest.raises(ValueError, match="recorded 1 handled operator calls but cpu_update_input has 2"):
            g.update([{"factor": 1.0}, {"factor": 2.0}])
        plain = torch.npu.NPUGraph()
        with torch.npu.graph(plain):
            torch.mul(x, 2.0)
        with pytest.raises(RuntimeError, match="auto_dispatch_capture=True"):
            plain.update([{"factor": 1.0}])
        unhandled = torch.npu.NPUGraph()
        with torch.npu.graph(unhandled, auto_dispatch_capture=True):
            torch.add(x, 2.0)
        with pytest.raises(ValueError, match="recorded no call of an operator with a registered handler"):
            unhandled.update([{"factor": 1.0}])
    finally:
        graph_handlers._NPU_GRAPH_OP_HANDLERS.pop("mul.Tensor", None)
    with pytest.raises(ValueError, match="subclass of NpuGraphOpHandler"):
        torch.npu.register_npu_graph_handler("mul.Tensor")(object)
    assert graph_handlers._NPU_GRAPH_OP_HANDLERS["npu_fused_infer_attention_score.default"].get_update_specs(
        "npu_fused_infer_attention_score.default")[0] == ("kwarg", "actual_seq_lengths", "actual_seq_lengths")


def test_intermediates_may_change_shape_while_the_group_result_keeps_its_place():
    # The shape of a valid-length attention: a slice of the valid length computed on, padded back to full length.
    x = torch.arange(1.0, 9.0).npu()

    def body(n):
        return torch.nn.functional.pad(x[:n].mul(2).exp(), (0, 8 - n))

    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        stream = torch.npu.current_stream()
        torch.npu.graph_task_group_begin(stream)
        out = body(3)
        handle = torch.npu.graph_task_group_end(stream)
        total = out.sum()
    s = torch.npu.Stream()
    for n in (6, 2, 5):  # (8 would pad nothing: the fill_ goes, a different task list, refused)
        with torch.npu.stream(s):
            torch.npu.graph_task_update_begin(s, handle)
            body(n)
            torch.npu.graph_task_update_end(s)
        torch.npu.current_stream().wait_stream(s)
        out.zero_()
        g.replay()
        expected = body(n)
        assert torch.equal(out.cpu(), expected.cpu())
        assert torch.equal(total.cpu(), expected.sum().cpu())


def test_auto_dispatch_capture_updates_fused_infer_attention_lengths():
    q, k, v = _qkv()
    g = torch.npu.NPUGraph()
    with torch.no_grad():
        with torch.npu.graph(g, auto_dispatch_capture=True):
            out = _ifa(q, k, v, [29])
            doubled = out * 2
    for lengths in ([100], [7], [29]):
        g.update([{"actual_seq_lengths": lengths}])
        g.replay()
        expected = _ifa(q, k, v, lengths)
        assert torch.equal(out.cpu(), expected.cpu())
        assert torch.equal(doubled.cpu(), (expected * 2).cpu())
