"""torch.profiler sees the npu: device kernels with device time, copies, memory events, stream tracks."""
import os

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import npudist._C as device_ext
import trace_checks as tc

pytestmark = pytest.mark.timeout(120)

NPU = torch.device("npu:0")


def run_ops():
    a = torch.randn(64, 64).to(NPU)  # HtoD copy
    b = torch.randn(64, 64, device=NPU)
    c = torch.mm(a, b) + b
    return c.cpu()  # DtoH copy


def profiled(**kw):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU], **kw) as prof:
        run_ops()
    return prof


def test_kernels_have_npu_device_time_in_key_averages():
    prof = profiled()
    rows = {r.key: r for r in prof.key_averages()}
    kernel = rows["npu:aten::mm"]
    assert kernel.device_type == DeviceType.PrivateUse1
    assert kernel.self_device_time_total > 0
    assert rows["npu:aten::add"].self_device_time_total > 0
    # Linked to the torch op that launched it: the op's device time includes its kernel.
    assert rows["aten::mm"].device_time_total >= kernel.self_device_time_total > 0
    assert rows["aten::mm"].self_cpu_time_total > 0
    assert "Memcpy HtoD (npu)" in rows and "Memcpy DtoH (npu)" in rows
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "npu:aten::mm" in table


def test_chrome_trace_has_one_track_per_npu_stream(tmp_path):
    prof = profiled()
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    trace = tc.load(path)
    tracks = tc.npu_tracks(trace)
    kernels = tc.device_events(trace, "kernel")
    names = {k["name"] for k in kernels}
    assert {"npu:aten::mm", "npu:aten::add"} <= names
    for k in kernels:
        assert (k["pid"], k["tid"]) in tracks, (k, tracks)
        assert k["dur"] > 0 and k["args"]["External id"] > 0
    assert tracks[(0, 0)] == "npu:0 stream 0 (default)"
    on_side_stream = torch.npu.Stream()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as prof2:
        with torch.npu.stream(on_side_stream):
            torch.ones(8, device=NPU).mul_(2)
    prof2.export_chrome_trace(path)
    trace = tc.load(path)
    muls = [k for k in tc.device_events(trace, "kernel") if k["name"] == "npu:aten::mul_"]
    assert [k["tid"] for k in muls] == [on_side_stream.stream_id]
    assert tc.npu_tracks(trace)[(0, on_side_stream.stream_id)].startswith("npu:0 stream ")


def test_profile_memory_gives_npu_memory_events(tmp_path):
    prof = profiled(profile_memory=True)
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    mem = tc.memory_events(tc.load(path))
    allocs = [e for e in mem if e["args"]["Bytes"] > 0]
    frees = [e for e in mem if e["args"]["Bytes"] < 0]
    assert any(e["args"]["Bytes"] == 64 * 64 * 4 for e in allocs)
    assert frees and all(e["args"]["Device Id"] == 0 for e in mem)
    assert all(e["args"]["Total Allocated"] >= 0 and e["args"]["Total Reserved"] > 0 for e in allocs)
    # key_averages attributes npu memory to the ops that allocated it.
    allocating = {r.key for r in prof.key_averages() if r.device_memory_usage > 0}
    assert "aten::mm" in allocating, allocating


def test_nothing_recorded_without_npu_activity():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_ops()
    assert not any(r.key.startswith("npu:") for r in prof.key_averages())
    assert not device_ext._profiler_recording()
    prof = profiled()
    assert not device_ext._profiler_recording()  # recording stops with the session


def test_torch_npu_profiler_api(tmp_path):
    import torch_npu

    npu_prof = torch_npu.profiler  # attribute access, as Ascend scripts use it after `import torch_npu`

    cfg = npu_prof._ExperimentalConfig(profiler_level=npu_prof.ProfilerLevel.Level1,
                                       aic_metrics=npu_prof.AiCMetrics.AiCoreNone)
    with npu_prof.profile(activities=[npu_prof.ProfilerActivity.CPU, npu_prof.ProfilerActivity.NPU],
                          schedule=npu_prof.schedule(wait=1, warmup=1, active=1, repeat=1),
                          on_trace_ready=npu_prof.tensorboard_trace_handler(str(tmp_path), worker_name="w0"),
                          experimental_config=cfg) as prof:
        for _ in range(4):
            run_ops()
            prof.step()
    files = os.listdir(tmp_path)
    assert len(files) == 1 and files[0].startswith("w0.") and files[0].endswith(".pt.trace.json"), files
    assert tc.device_events(tc.load(str(tmp_path / files[0])), "kernel")
    assert torch_npu.profiler.ProfilerActivity.NPU is torch.profiler.ProfilerActivity.NPU
    with pytest.warns(UserWarning, match="hardware counters"):
        npu_prof.profile(experimental_config=npu_prof._ExperimentalConfig(
            aic_metrics=npu_prof.AiCMetrics.PipeUtilization))
    with pytest.raises(ValueError, match="profiler_level"):
        npu_prof.profile(experimental_config=npu_prof._ExperimentalConfig(profiler_level="Level9"))
    with pytest.raises(ValueError, match="unknown option"):
        npu_prof._ExperimentalConfig(aic_metric="x")
