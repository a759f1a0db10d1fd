"""One rank of a profiled FSDP2 step on npu + hccl (started by tests/hccl/launcher.py).

The rank profiles one training step of a tiny fully_shard model with CPU + NPU activities and
profile_memory, exports the Chrome trace to $HCCL_TEST_TMP/trace_<rank>.json and checks it: device time
per npu kernel in key_averages(), sized hccl collectives on the comm stream's track, npu memory events.
Prints "SCENARIO OK" when every check passed.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile

import npudist  # noqa: F401  (npu device, hccl backend, npu profiler activity source)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_checks as tc  # noqa: E402

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
HIDDEN = 16


def build_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 4))
    mesh = init_device_mesh("npu", (WS,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model.to("npu"), mesh=mesh)


def step(model, opt):
    x = torch.randn(8, HIDDEN, device="npu")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def check_key_averages(prof):
    rows = {r.key: r for r in prof.key_averages()}
    kernels = {k: r for k, r in rows.items() if k.startswith("npu:aten::")}
    assert "npu:aten::addmm" in kernels or "npu:aten::mm" in kernels, sorted(rows)
    assert all(r.self_device_time_total > 0 for r in kernels.values()), {
        k: r.self_device_time_total for k, r in kernels.items()}
    collectives = {k: r for k, r in rows.items() if k.startswith("hccl:")}
    assert "hccl:all_gather_into_tensor" in collectives, sorted(rows)
    assert "hccl:reduce_scatter_tensor" in collectives, sorted(rows)
    assert all(r.self_device_time_total > 0 for r in collectives.values())


def check_trace(path):
    trace = tc.load(path)
    tracks = tc.npu_tracks(trace)
    kernels = tc.device_events(trace, "kernel")
    assert kernels and all((k["pid"], k["tid"]) in tracks for k in kernels)
    colls = [k for k in kernels if k["name"].startswith("hccl:")]
    assert {"hccl:all_gather_into_tensor", "hccl:reduce_scatter_tensor"} <= {c["name"] for c in colls}
    seqs = []
    for c in colls:
        a = c["args"]
        track = tracks[(c["pid"], c["tid"])]
        assert track.endswith("(hccl)"), (c, track)  # the group's comm stream, named as such
        assert c["pid"] == RANK  # the rank's npu device
        assert a["In msg nelems"] > 0 and a["Out msg nelems"] > 0, a
        assert a["Process Group Ranks"] == str(list(range(WS))) and a["Group size"] == WS
        assert a["dtype"] == "Float" and a["Seq"] > 0
        if c["name"] == "hccl:all_gather_into_tensor":
            assert a["Out msg nelems"] == WS * a["In msg nelems"], a
        if c["name"] == "hccl:reduce_scatter_tensor":
            assert a["In msg nelems"] == WS * a["Out msg nelems"], a
        seqs.append((a["Process Group Name"], a["Seq"]))
    assert len(set(seqs)) == len(seqs), seqs  # one event per collective
    compute = [k for k in kernels if k["name"].startswith("npu:aten::")]
    assert compute and {k["tid"] for k in compute} != {c["tid"] for c in colls}
    mem = tc.memory_events(trace)
    assert any(e["args"]["Bytes"] > 0 and e["args"]["Device Id"] == RANK for e in mem)


def main():
    torch.npu.set_device(RANK)
    dist.init_process_group("hccl", init_method="file://" + os.environ["HCCL_TEST_STORE"], rank=RANK,
                            world_size=WS)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step(model, opt)  # warm-up: lazy init outside the profiled step
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU], profile_memory=True) as prof:
        step(model, opt)
        torch.npu.synchronize()
    check_key_averages(prof)
    path = os.path.join(os.environ["HCCL_TEST_TMP"], f"trace_{RANK}.json")
    prof.export_chrome_trace(path)
    check_trace(path)
    dist.destroy_process_group()
    print("SCENARIO OK", flush=True)


if __name__ == "__main__":
    main()
