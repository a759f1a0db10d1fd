"""npu RNG: per-device generators, reproducible, independent of the CPU generator, (seed, offset) state."""
import pytest
import torch


def test_manual_seed_reproducible_and_offset_advances():
    torch.npu.manual_seed(5)
    a = torch.randn(100, device="npu")
    state = torch.npu.get_rng_state()
    b = torch.randn(100, device="npu")
    torch.npu.manual_seed(5)
    assert torch.equal(torch.randn(100, device="npu").cpu(), a.cpu())
    torch.npu.set_rng_state(state)
    assert torch.equal(torch.randn(100, device="npu").cpu(), b.cpu())
    assert not torch.equal(a.cpu(), b.cpu())


def test_state_is_seed_and_offset():
    torch.npu.manual_seed(1234)
    st = torch.npu.get_rng_state()
    assert st.dtype == torch.uint8 and st.numel() == 16
    assert st[:8].view(torch.int64).item() == 1234 and st[8:].view(torch.int64).item() == 0
    torch.rand(10, device="npu")
    assert torch.npu.get_rng_state()[8:].view(torch.int64).item() > 0
    with pytest.raises(ValueError, match="16-byte"):
        torch.npu.set_rng_state(torch.zeros(5, dtype=torch.uint8))


def test_independent_of_cpu_generator():
    torch.manual_seed(0)
    cpu_state = torch.get_rng_state()
    torch.npu.manual_seed(99)
    x = torch.rand(50, device="npu")
    torch.nn.functional.dropout(torch.ones(50, device="npu"), 0.5)
    assert torch.equal(torch.get_rng_state(), cpu_state)  # npu ops did not consume the CPU stream
    torch.manual_seed(0)
    torch.npu.manual_seed(99)
    torch.rand(3)  # CPU draws do not disturb the npu stream
    assert torch.equal(torch.rand(50, device="npu").cpu(), x.cpu())


def test_per_device_generators_and_manual_seed_all():
    torch.manual_seed(3)  # seeds every npu device too
    states = torch.npu.get_rng_state_all()
    assert len(states) == torch.npu.device_count()
    a0 = torch.randn(10, device="npu:0")
    a1 = torch.randn(10, device="npu:1")
    assert torch.equal(a0.cpu(), a1.cpu())  # same seed, same (seed, offset) -> same numbers
    torch.npu.set_rng_state_all(states)
    assert torch.equal(torch.randn(10, device="npu:1").cpu(), a1.cpu())


def test_explicit_generator_and_fork_rng():
    g = torch.Generator(device="npu")
    g.manual_seed(11)
    a = torch.randn(8, device="npu", generator=g)
    g.manual_seed(11)
    assert torch.equal(torch.randn(8, device="npu", generator=g).cpu(), a.cpu())
    torch.npu.manual_seed(1)
    with torch.random.fork_rng(devices=[0], device_type="npu"):
        torch.randn(4, device="npu")
    after = torch.randn(4, device="npu")
    torch.npu.manual_seed(1)
    assert torch.equal(torch.randn(4, device="npu").cpu(), after.cpu())
    with pytest.raises(RuntimeError, match="npu"):
        torch.randn(3, device="npu", generator=torch.Generator())


def test_random_ops_cover_common_samplers():
    torch.npu.manual_seed(0)
    x = torch.empty(1000, device="npu")
    assert 0.0 <= x.uniform_().min().item() and x.max().item() < 1.0
    assert abs(torch.randn(10000, device="npu").mean().item()) < 0.1
    p = torch.randperm(10, device="npu")
    assert p.device.type == "npu" and sorted(p.tolist()) == list(range(10))
    assert torch.randint(0, 5, (100,), device="npu").max().item() < 5
    assert torch.bernoulli(torch.full((100,), 0.5, device="npu")).device.type == "npu"


def test_dtensor_random_ops_use_the_npu_state():
    from .conftest import run_python
    code = """
import torch, npudist, torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_tensor, Shard
import torch.distributed.tensor._random as dtensor_random
dist.init_process_group("hccl", rank=0, world_size=1, store=dist.HashStore())
torch.npu.set_device(0)
mesh = DeviceMesh("npu", [0])
def run():
    torch.manual_seed(5)
    d = distribute_tensor(torch.empty(8, 8, device="npu"), mesh, [Shard(0)])
    torch.nn.init.uniform_(d)
    return d.full_tensor().cpu(), torch.npu.get_rng_state()[8:].view(torch.int64).item()
(a, off_a), (b, off_b) = run(), run()
assert type(dtensor_random._rng_tracker).__name__ == "OffsetBasedRNGTracker"
assert torch.equal(a, b) and off_a == off_b == 64, (off_a, off_b)
assert 0 <= a.min().item() and a.max().item() < 1 and a.std().item() > 0.1
dist.destroy_process_group()
print("ok")
"""
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
