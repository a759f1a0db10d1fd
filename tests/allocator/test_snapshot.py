"""_record_memory_history/_snapshot/_dump_snapshot produce torch.cuda's snapshot format with Python
frames, and PyTorch's own torch.cuda._memory_viz reads it."""
import base64
import json
import pickle
import re

import pytest
import torch
from torch.cuda import _memory_viz

import npudist  # noqa: F401

MiB = 1 << 20


@pytest.fixture
def history():
    torch.npu.memory._record_memory_history("all", context="all", stacks="python", clear_history=True)
    yield
    torch.npu.memory._record_memory_history(None)


def make_activation():
    return torch.empty(3 * MiB, dtype=torch.uint8, device="npu")


def make_scratch():
    t = torch.empty(300 * 1024, dtype=torch.uint8, device="npu")
    del t


def test_snapshot_structure_and_frames(history):
    act = make_activation()
    make_scratch()
    snap = torch.npu.memory._snapshot()
    assert set(snap) == {"segments", "device_traces", "allocator_settings"}
    seg_keys = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
    for seg in snap["segments"]:
        assert set(seg) == seg_keys
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        addr = seg["address"]
        for b in seg["blocks"]:
            assert set(b) == {"address", "size", "requested_size", "state", "frames"}
            assert b["address"] == addr and b["state"] in ("active_allocated", "active_pending_free", "inactive")
            addr += b["size"]
    block = next(b for s in snap["segments"] for b in s["blocks"] if b["address"] == act.data_ptr())
    assert block["state"] == "active_allocated" and block["requested_size"] == 3 * MiB
    names = [f["name"] for f in block["frames"]]
    assert "make_activation" in names and "test_snapshot_structure_and_frames" in names
    frame = block["frames"][names.index("make_activation")]
    assert frame["filename"].endswith("test_snapshot.py") and isinstance(frame["line"], int)

    trace = snap["device_traces"][0]
    actions = [e["action"] for e in trace]
    assert actions[-1] == "snapshot"
    scratch = [e for e in trace if e["size"] == 300 * 1024]
    assert [e["action"] for e in scratch] == ["alloc", "free_requested", "free_completed"]
    assert any(f["name"] == "make_scratch" for f in scratch[0]["frames"])
    assert any(f["name"] == "make_scratch" for f in scratch[1]["frames"])  # context="all": frees too
    assert all(e["time_us"] > 0 and e["stream"] == 0 for e in scratch)
    assert len(snap["device_traces"]) == torch.npu.device_count()


def test_memory_viz_reads_snapshot(history, tmp_path):
    act = make_activation()  # noqa: F841
    make_scratch()
    path = tmp_path / "snap.pickle"
    torch.npu.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snap = pickle.load(f)
    # Flamegraph inputs (the flamegraph renderer itself is an external perl script; take its input).
    seg_lines = _memory_viz.segments(snap, format_flamegraph=lambda text: text)
    assert re.search(r"stream_0;seg_\d+;active_allocated;.*make_activation.* 3145728", seg_lines)
    mem_lines = _memory_viz.memory(snap, format_flamegraph=lambda text: text)
    assert "make_activation" in mem_lines
    summary = _memory_viz.segsum(snap)
    assert "segments:" in summary and "total_reserved" in summary
    events = _memory_viz.trace(snap)
    # The block is a slice of a segment that existed before recording ("seg_N") or of one allocated while
    # recording (named like a variable after its "cudaMalloc" line): which one depends on the tests before.
    assert re.search(r"\w+ = \w+\[0:3.0MiB\]", events) and "del " in events
    html = _memory_viz.trace_plot(snap)
    payload = json.loads(re.search(r"(\[\{\"name\": \"snapshot.pickle\".*?\}\])", html).group(1))
    embedded = pickle.loads(base64.b64decode(payload[0]["base64"]))
    assert embedded["segments"] == snap["segments"]
    assert _memory_viz.segment_plot(snap).startswith("<!DOCTYPE html>") or "<html" in _memory_viz.segment_plot(snap)
    torch.npu.empty_cache()
    before = torch.npu.memory_snapshot()
    # Larger than any segment left (tests before this one in the worker may hold big ones): a new segment.
    size = max([25 * MiB] + [seg["total_size"] + 2 * MiB for seg in before])
    extra = torch.empty(size, dtype=torch.uint8, device="npu")  # noqa: F841
    diff = _memory_viz.compare(before, torch.npu.memory_snapshot(), format_flamegraph=lambda text: text)
    assert "only_after" in diff


def test_history_options():
    torch.npu.memory._record_memory_history("all", context=None, stacks="python", max_entries=4, clear_history=True)
    try:
        for _ in range(5):
            make_scratch()
        trace = torch.npu.memory._snapshot()["device_traces"][0]
        assert len(trace) == 4 and trace[-1]["action"] == "snapshot"
        assert all(e["frames"] == [] for e in trace)  # context=None: no stacks
        torch.npu.memory._record_memory_history("all", context="alloc", stacks="python", clear_history=True,
                                                skip_actions=["free_requested", "snapshot"])
        make_scratch()
        trace = torch.npu.memory._snapshot()["device_traces"][0]
        assert [e["action"] for e in trace] == ["alloc", "free_completed"]
        assert trace[0]["frames"] and trace[1]["frames"] == []
        torch.npu.memory._record_memory_history("all", context="state", stacks="python", clear_history=True)
        live = make_activation()
        snap = torch.npu.memory._snapshot()
        block = next(b for s in snap["segments"] for b in s["blocks"] if b["address"] == live.data_ptr())
        assert any(f["name"] == "make_activation" for f in block["frames"])  # stacks on live blocks only
        assert all(e["frames"] == [] for e in snap["device_traces"][0])
        del live
        with pytest.raises(ValueError, match="unknown action 'allocate'"):
            torch.npu.memory._record_memory_history("all", skip_actions=["allocate"])
        with pytest.raises(ValueError, match="enabled must be None, 'state' or 'all'"):
            torch.npu.memory._record_memory_history("everything")
    finally:
        torch.npu.memory._record_memory_history(None)
    assert torch.npu.memory._snapshot()["device_traces"][0] == []
