"""The device's stream budget (docs/device.md, "Stream budget"): streams held by ACL callers and captured NPUGraphs
run out where an Atlas A2 device's do (1984, the default stream and torch's pool of 64 included), with CANN's code
and the counts, and come back when released. Fresh interpreters: the counts are per process."""
import textwrap

from .conftest import run_python

# Creates ACL streams until the budget refuses one: `streams` holds them, `ret` the refusal's code.
EXHAUST = textwrap.dedent("""
    import gc, torch, npudist, acl
    streams = []
    while True:
        s, ret = acl.rt.create_stream()
        if ret:
            break
        streams.append(s)
""")

BUDGET_SCRIPT = EXHAUST + textwrap.dedent("""
    print("created", len(streams), "ret", ret)
    print("msg", acl.get_recent_err_msg())
    assert torch.npu.Stream() is not None  # torch's pool is outside the budget: never exhausted
    g = torch.npu.NPUGraph()
    x = torch.ones(4, device="npu")
    try:
        with torch.npu.graph(g):
            x.mul_(2)
    except RuntimeError as e:
        print("capture", str(e).splitlines()[0])
    assert acl.rt.destroy_stream(streams.pop()) == 0
    with torch.npu.graph(g):  # the stream given back lets one capture in
        x.mul_(2)
    g.replay()
    print("replayed", x.tolist())
    s, ret = acl.rt.create_stream()
    print("while captured", ret)
    g.reset()  # the graph gives its stream back
    s, ret = acl.rt.create_stream()
    print("after reset", ret)
""")


def test_streams_run_out_with_canns_code_and_come_back():
    res = run_python(BUDGET_SCRIPT, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "created 1919 ret 207008" in out, out  # 1984 - 1 default - 64 pooled
    msg = next(line for line in out.splitlines() if line.startswith("msg "))
    assert "error code 207008" in msg and "1984 streams" in msg and "1919 by aclrtCreateStream" in msg, msg
    assert "aclrtDestroyStream" in msg  # the fix
    capture = next(line for line in out.splitlines() if line.startswith("capture "))
    assert "NPUGraph.capture_begin" in capture and "error code 207008" in capture, capture
    assert "replayed [4.0, 4.0, 4.0, 4.0]" in out, out  # captured once (x2), replayed once (x2)
    assert "while captured 207008" in out and "after reset 0" in out, out


def test_a_failed_capture_and_a_deleted_graph_give_their_stream_back():
    res = run_python(EXHAUST + textwrap.dedent("""
        acl.rt.destroy_stream(streams.pop())  # exactly one stream left
        x = torch.ones(4, device="npu")
        for _ in range(3):  # a capture that fails gives its stream back at once
            g = torch.npu.NPUGraph()
            try:
                with torch.npu.graph(g):
                    x.sum().item()
            except RuntimeError as e:
                assert "error code 107030" in str(e), e
        for _ in range(3):  # a captured graph that is deleted gives its stream back
            g = torch.npu.NPUGraph()
            with torch.npu.graph(g):
                x.add_(1)
            del g
            gc.collect()
        print("ok", x.tolist())
    """), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ok [4.0, 4.0, 4.0, 4.0]" in res.stdout, res.stdout
