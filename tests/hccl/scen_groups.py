"""Scenarios: groups (new_group, split_group, DeviceMesh, options), mixed backends, DDP, stream order."""
from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from common import RANK, WS, close, init, scenario
from scen_ops import check_all_reduce_matrix, check_other_collectives


@scenario
def groups():
    """new_group subgroups, several groups in flight, split_group, DeviceMesh sub-meshes, options."""
    from torch.distributed.device_mesh import init_device_mesh

    import npudist.hccl as hccl

    opts = hccl.ProcessGroupHCCL.Options()
    opts.hccl_config = {"hccl_buffer_size": 2}
    init(pg_options=opts, device_id=torch.device("npu", 0))
    world = dist.group.WORLD
    be = world._get_backend(torch.device("npu"))
    assert isinstance(be, hccl.ProcessGroupHCCL), type(be)
    assert be.buffer_bytes == 2 << 20, be.buffer_bytes
    assert be.num_nodes == 1 and not be.uses_gloo
    assert dist.get_backend() == "hccl"
    assert dist.Backend.default_device_backend_map["npu"] == "hccl"
    # Subgroups: evens and odds, each checked with the full all_reduce matrix on small sizes.
    evens, odds = list(range(0, WS, 2)), list(range(1, WS, 2))
    g_even = dist.new_group(evens, timeout=timedelta(seconds=30))
    g_odd = dist.new_group(odds)
    mine, ranks = (g_even, evens) if RANK % 2 == 0 else (g_odd, odds)
    if len(ranks) > 1:
        check_all_reduce_matrix("cpu", [1, 5], group=mine, ranks=ranks)
        check_other_collectives("npu", 3, group=mine, ranks=ranks)
    # Several groups in flight: async ops on the world and the subgroup interleaved, waited late.
    works, want = [], []
    for i in range(6):
        t = torch.full((1000,), float(RANK + i), device="npu")
        works.append((dist.all_reduce(t, group=world, async_op=True), t,
                      float(sum(r + i for r in range(WS)))))
        u = torch.full((10,), float(RANK * i))
        works.append((dist.all_reduce(u, group=mine, async_op=True), u, float(sum(r * i for r in ranks))))
    for w, t, v in works:
        w.wait()
        close(t, torch.full(t.shape, v), "groups in flight")
    # split_group
    sub = dist.split_group(split_ranks=[evens, odds])
    t = torch.ones(4, device="npu")
    dist.all_reduce(t, group=sub)
    close(t, torch.full((4,), float(len(ranks))), "split_group")
    sb = sub._get_backend(torch.device("npu"))
    assert isinstance(sb, hccl.ProcessGroupHCCL) and sb.buffer_bytes == 2 << 20
    # DeviceMesh sub-meshes (2 x WS/2): reduce along each dim
    if WS % 2 == 0 and WS >= 4:
        mesh = init_device_mesh("npu", (2, WS // 2), mesh_dim_names=("dp", "tp"))
        for dim in ("dp", "tp"):
            g = mesh.get_group(dim)
            members = dist.get_process_group_ranks(g)
            t = torch.full((3,), float(RANK), device="npu")
            dist.all_reduce(t, group=g)
            close(t, torch.full((3,), float(sum(members))), f"mesh {dim}")
    dist.destroy_process_group()


@scenario
def mixed_backends():
    """init_process_group("cpu:gloo,npu:hccl"): cpu tensors go to Gloo, npu tensors to hccl."""
    import npudist.hccl as hccl

    init("cpu:gloo,npu:hccl")
    world = dist.group.WORLD
    assert isinstance(world._get_backend(torch.device("npu")), hccl.ProcessGroupHCCL)
    assert not isinstance(world._get_backend(torch.device("cpu")), hccl.ProcessGroupHCCL)
    a, b = torch.full((5,), float(RANK)), torch.full((5,), float(RANK), device="npu")
    dist.all_reduce(a)
    dist.all_reduce(b)
    want = torch.full((5,), float(sum(range(WS))))
    close(a, want, "gloo cpu")
    close(b, want, "hccl npu")
    dist.destroy_process_group()


@scenario
def exec_timeout_env():
    """HCCL_EXEC_TIMEOUT sets the op timeout when init_process_group was given none."""
    dist.init_process_group("hccl", init_method="file://" + os.environ["HCCL_TEST_STORE"], rank=RANK,
                            world_size=WS)
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert be.timeout == timedelta(seconds=int(os.environ["HCCL_EXEC_TIMEOUT"])), be.timeout
    g = dist.new_group(timeout=timedelta(seconds=17))
    assert g._get_backend(torch.device("cpu")).timeout == timedelta(seconds=17)
    dist.destroy_process_group()


@scenario
def ddp():
    """DDP on npu with hccl (plus a communication hook through get_future) matches one process."""
    import copy

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    ddp_model = DDP(copy.deepcopy(model).npu())
    if len(sys.argv) > 2 and sys.argv[2] == "hook":
        ddp_model.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(42)
    for _ in range(4):
        x, y = torch.randn(4 * WS, 8, generator=g), torch.randn(4 * WS, 4, generator=g)
        shard = slice(RANK * 4, (RANK + 1) * 4)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp_model(x[shard].npu()), y[shard].npu()).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for (name, p), q in zip(ddp_model.module.named_parameters(), ref.parameters()):
        assert p.device.type == "npu"
        diff = (p.detach().cpu() - q.detach()).abs().max().item()
        assert diff < 1e-5, f"{name}: DDP differs from single-process training by {diff}"
    dist.destroy_process_group()


@scenario
def stream_order():
    """npu ops are ordered after work already queued on the caller's current stream (sync and async),
    also on a non-default current stream."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    from runtime_ext import launch_host_fill

    init()
    want = float(sum(r + 1 for r in range(WS)))
    side = torch.npu.Stream()
    for stream in (torch.npu.current_stream(), side):
        with torch.npu.stream(stream):
            sid = torch.npu.current_stream().npu_stream
            for mode in ("async", "sync"):
                t = torch.zeros(1000, device="npu")
                # A slow host function on the current stream writes the input; the op must see it.
                launch_host_fill(t, float(RANK + 1), 200_000, sid)
                if mode == "async":
                    dist.all_reduce(t, async_op=True).wait()
                else:
                    dist.all_reduce(t)
                close(t, torch.full((1000,), want), f"{mode} all_reduce after queued stream work")
    dist.destroy_process_group()
