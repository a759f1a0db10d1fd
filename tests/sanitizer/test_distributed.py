"""The npu stream sanitizer on 2 hccl ranks: async collectives waited before use, FSDP2, TP and DDP training run
clean (and train exactly as without it); a collective's buffer read before ``wait()`` / ``wait_tensor``, and FSDP2
with its unshard wait hidden, are flagged. One spawn runs every scenario (CI time)."""
import pytest

from dist_helpers import run_ranks

pytestmark = pytest.mark.timeout(240)

HIDDEN = 16


def _flag(fn):
    """'clean' if fn() passes the sanitizer, else the report."""
    from npudist.device.sanitizer import StreamSanitizerError
    try:
        fn()
        return "clean"
    except StreamSanitizerError as e:
        return str(e)


def _collectives(rank, world):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    out = {}

    def c10d_waited():
        t = torch.full((8,), rank + 1.0, device="npu")
        dist.all_reduce(t, async_op=True).wait()
        g = torch.empty(8 * world, device="npu")
        dist.all_gather_into_tensor(g, t)   # synchronous: c10d waits for us
        r = torch.empty(8, device="npu")
        dist.reduce_scatter_tensor(r, g, async_op=True).wait()
        out["c10d_values"] = [t[0].item(), g.sum().item(), r[0].item()]

    def c10d_read_before_wait():
        t = torch.ones(8, device="npu")
        work = dist.all_reduce(t, async_op=True)
        try:
            t.sum()   # READ-BEFORE-WAIT
        finally:
            work.wait()

    def c10d_write_input_before_wait():
        src = torch.ones(8, device="npu")
        dst = torch.empty(8 * world, device="npu")
        work = dist.all_gather_into_tensor(dst, src, async_op=True)
        try:
            src.zero_()   # the collective may still be reading it
        finally:
            work.wait()

    def functional_waited():
        t = torch.full((8,), rank + 1.0, device="npu")
        y = funcol.all_reduce(t, "sum", dist.group.WORLD)   # AsyncCollectiveTensor: waits on first use
        out["functional_value"] = (y * 2)[0].item()
        z = torch.ops._c10d_functional.all_gather_into_tensor(t, world, dist.group.WORLD.group_name)
        z = torch.ops._c10d_functional.wait_tensor(z)
        out["functional_gather"] = z.sum().item()

    def functional_read_before_wait_tensor():
        t = torch.ones(8, device="npu")
        z = torch.ops._c10d_functional.all_reduce(t, "sum", dist.group.WORLD.group_name)
        try:
            z.sum()
        finally:
            torch.ops._c10d_functional.wait_tensor(z)

    def dtensor_redistribution_inside_dispatch():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Partial

        from npudist.device import sanitizer

        seen = sanitizer._sanitizer.tracker.collectives
        before = seen["_c10d_functional.all_reduce.default"]
        partial = DTensor.from_local(torch.full((4,), rank + 1.0, device="npu"), init_device_mesh("npu", (world,)),
                                     [Partial()])
        out["dtensor_value"] = torch.relu(partial).to_local()[0].item()   # relu needs the sum: an all_reduce
        out["dtensor_all_reduces"] = seen["_c10d_functional.all_reduce.default"] - before

    for fn in (c10d_waited, c10d_read_before_wait, c10d_write_input_before_wait, functional_waited,
               functional_read_before_wait_tensor, dtensor_redistribution_inside_dispatch):
        out[fn.__name__] = _flag(fn)
    return out


def _train(parallelism, world, steps=2):
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(2 * HIDDEN, HIDDEN)).to("npu")
    mesh = init_device_mesh("npu", (world,))
    if parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, bucket_cap_mb=0.001)   # several buckets
    elif parallelism == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, HIDDEN, generator=gen).to("npu")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _fsdp_without_unshard_wait(world):
    """FSDP2 with the current stream's wait for the all-gather made invisible to the sanitizer (as if the
    wait were missing): the copy-out of the all-gather output must be flagged."""
    import torch
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    from npudist.device import streams

    def untraced_wait_event(stream, event):
        torch.Event.wait(event, stream)

    real_unshard_wait, real_wait_event = FSDPParamGroup.wait_for_unshard, streams.Stream.wait_event

    def wait_for_unshard(self):
        streams.Stream.wait_event = untraced_wait_event
        try:
            return real_unshard_wait(self)
        finally:
            streams.Stream.wait_event = real_wait_event

    FSDPParamGroup.wait_for_unshard = wait_for_unshard
    try:
        return _flag(lambda: _train("fsdp", world, steps=1))
    finally:
        FSDPParamGroup.wait_for_unshard = real_unshard_wait


def _scenarios(rank, world):
    from npudist.device import sanitizer

    kinds = ("fsdp", "tp", "ddp")
    plain = {p: _train(p, world) for p in kinds}
    try:
        sanitizer.enable()
        out = _collectives(rank, world)
        for p in kinds:
            sanitizer.disable()
            san = sanitizer.enable()   # a fresh tracker per run: what it saw is this run's
            result = {}
            out[p] = _flag(lambda: result.setdefault("losses", _train(p, world)))
            out[p + "_same_losses"] = result.get("losses") == plain[p]
            out[p + "_collectives"] = sorted(san.tracker.collectives)
            out[p + "_works_kept"] = len(san.mode.live_works)
        out["fsdp_missing_wait"] = _fsdp_without_unshard_wait(world)
    finally:
        sanitizer.disable()
    return out


def _check_async_collectives_waited_before_use_run_clean(r):
    assert r["c10d_waited"] == "clean" and r["functional_waited"] == "clean", r
    assert r["c10d_values"] == [3.0, 48.0, 6.0] and r["functional_value"] == 6.0
    assert r["functional_gather"] == 24.0


def _check_collective_inside_dtensor_dispatch_is_seen(r):
    assert r["dtensor_redistribution_inside_dispatch"] == "clean", r["dtensor_redistribution_inside_dispatch"]
    assert r["dtensor_value"] == 3.0 and r["dtensor_all_reduces"] == 1


def _check_collective_buffer_read_before_wait_is_flagged(r):
    msg = r["c10d_read_before_wait"]
    assert "reading tensor(shape=(8,), dtype=torch.float32" in msg and "aten.sum" in msg, msg
    assert "(default stream)" in msg and "hccl comm stream of group" in msg and "c10d.allreduce_" in msg
    assert "t.sum()   # READ-BEFORE-WAIT" in msg and "dist.all_reduce(t, async_op=True)" in msg
    msg = r["c10d_write_input_before_wait"]
    assert "writing" in msg and "aten.zero_" in msg and "c10d._allgather_base_" in msg, msg
    msg = r["functional_read_before_wait_tensor"]
    assert "_c10d_functional.all_reduce" in msg and "hccl comm stream" in msg, msg


# The gradient collective of each, which the sanitizer must have seen on the comm stream.
COLLECTIVE = {"fsdp": "c10d._reduce_scatter_base_.default", "tp": "_c10d_functional.all_reduce.default",
              "ddp": "c10d.allreduce_.default"}


def _check_training_runs_clean(r, parallelism):
    assert r[parallelism] == "clean", r[parallelism]
    assert r[parallelism + "_same_losses"], parallelism
    assert r[parallelism + "_works_kept"] == 0   # every Work was waited or had its future consumed (no leak)
    assert COLLECTIVE[parallelism] in r[parallelism + "_collectives"], r[parallelism + "_collectives"]


def _check_fsdp_missing_unshard_wait_is_flagged(r):
    msg = r["fsdp_missing_wait"]
    assert "fsdp.split_with_sizes_copy" in msg and "all_gather_output" in msg, msg


def test_two_ranks_under_the_sanitizer():
    # One test, one spawn: xdist may spread a module's tests over workers, each paying for the ranks again.
    for r in run_ranks(_scenarios, 2, backend="hccl", timeout=200):
        _check_async_collectives_waited_before_use_run_clean(r)
        _check_collective_inside_dtensor_dispatch_is_seen(r)
        _check_collective_buffer_read_before_wait_is_flagged(r)
        for parallelism in ("fsdp", "tp", "ddp"):
            _check_training_runs_clean(r, parallelism)
        _check_fsdp_missing_unshard_wait_is_flagged(r)
