"""One rank of the BatchNorm / SyncBatchNorm DDP scenarios on npu over hccl (tests/device/test_npu_syncbn.py).

Usage (started by tests/hccl/launcher.py): syncbn_worker.py <bn|syncbn>. Each rank trains a small CNN
with DDP on its shard of a global batch and compares with single-process CPU training of the same
model: with SyncBatchNorm that is plain BatchNorm on the whole batch; with BatchNorm every shard is
normalised by its own statistics. All ranks must end with identical parameters.
"""
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hccl"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from common import RANK, WS, init  # noqa: E402

PER_RANK = 4
STEPS = 3


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.Conv2d(6, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5))


def batches():
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        yield torch.randn(PER_RANK * WS, 3, 8, 8, generator=g), torch.randint(0, 5, (PER_RANK * WS,), generator=g)


def reference(model: nn.Module, sync: bool) -> nn.Module:
    """Single-process CPU training equivalent to the DDP run (DDP averages the ranks' gradients)."""
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches():
        opt.zero_grad()
        if sync:
            F.cross_entropy(ref(x), y).backward()
        else:
            loss = sum(F.cross_entropy(ref(xs), ys) for xs, ys in zip(x.split(PER_RANK), y.split(PER_RANK)))
            (loss / WS).backward()
        opt.step()
    return ref


def check_identical_across_ranks(tensors) -> None:
    flat = torch.cat([t.detach().reshape(-1) for t in tensors if t.is_floating_point()])
    gathered = [torch.empty_like(flat) for _ in range(WS)]
    dist.all_gather(gathered, flat)
    for r, other in enumerate(gathered):
        assert torch.equal(other, flat), f"rank {r} ended with different weights than rank {RANK}"


def run(sync: bool) -> None:
    init()
    model = build_model()
    ref = reference(model, sync)
    net = copy.deepcopy(model)
    if sync:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    ddp = DDP(net.npu())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    shard = slice(RANK * PER_RANK, (RANK + 1) * PER_RANK)
    for x, y in batches():
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x[shard].npu()), y[shard].npu())
        assert loss.device.type == "npu" and torch.isfinite(loss).item()
        loss.backward()
        opt.step()
    # With plain BatchNorm, running statistics are rank-local (DDP broadcasts rank 0's before each
    # forward, then each rank updates them with its shard); with SyncBatchNorm they are global.
    check_identical_across_ranks(ddp.module.state_dict().values() if sync else ddp.module.parameters())
    mine = ddp.module.state_dict()
    names = mine.keys() if sync else [n for n, _ in ddp.module.named_parameters()]
    for name in names:
        got, want = mine[name].cpu(), ref.state_dict()[name]
        if not got.is_floating_point():
            assert torch.equal(got, want), name
            continue
        diff = (got - want).abs().max().item()
        assert diff < 1e-5, f"{name}: DDP on npu differs from single-process training by {diff}"
    dist.destroy_process_group()


if __name__ == "__main__":
    run(sync={"syncbn": True, "bn": False}[sys.argv[1]])
    print("SCENARIO OK", flush=True)
