"""Pinned host memory from the caching host allocator: torch.npu.host_memory_stats() and friends, modelled
on PyTorch's test_cuda.py host allocator tests and torch_npu's test_host_memory_stats (deltas, because other
tests in the worker may hold pinned memory)."""
import itertools
import os
import sys

import pytest
import torch

import npudist  # noqa: F401
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from runtime_ext import HostGate  # noqa: E402

# torch.cuda.host_memory_stats() keys in torch 2.13.
CUDA_HOST_KEYS = ({f"{a}.{m}" for a, m in itertools.product(
    ["allocations", "allocated_bytes", "active_requests", "active_bytes"], ["current", "peak", "allocated", "freed"])}
    | {f"{t}.{m}" for t, m in itertools.product(["host_alloc_time", "host_free_time"],
                                                  ["total", "max", "min", "count", "avg"])}
    | {"num_host_alloc", "num_host_free"})


def stats():
    return torch.npu.host_memory_stats()


def delta(before, after, key):
    return after[key] - before[key]


def test_host_memory_stats_keys_match_cuda():
    torch.empty(1, pin_memory=True)
    s = stats()
    assert set(s) == CUDA_HOST_KEYS
    assert list(s) == sorted(s)
    nested = torch.npu.host_memory_stats_as_nested_dict()
    assert nested["allocations"]["current"] == s["allocations.current"]
    assert nested["host_alloc_time"]["count"] == s["host_alloc_time.count"]
    import torch_npu  # noqa: F401 - the torch_npu.npu spellings are the same functions
    for name in ("host_memory_stats", "host_memory_stats_as_nested_dict", "host_empty_cache",
                 "reset_peak_host_memory_stats", "reset_accumulated_host_memory_stats", "MemPool", "use_mem_pool"):
        assert getattr(torch_npu.npu, name) is getattr(torch.npu, name)


def test_pinned_blocks_are_cached_by_power_of_two_size_and_reused():
    torch.npu.host_empty_cache()
    s0 = stats()
    a = torch.empty(1000, dtype=torch.uint8, pin_memory=True)     # a 1024-byte block
    assert a.is_pinned()
    s1 = stats()
    assert delta(s0, s1, "allocations.current") == 1 and delta(s0, s1, "allocated_bytes.current") == 1024
    assert delta(s0, s1, "active_requests.current") == 1 and delta(s0, s1, "active_bytes.current") == 1024
    assert delta(s0, s1, "num_host_alloc") == 1
    pa = a.data_ptr()
    del a
    s2 = stats()
    assert delta(s1, s2, "active_requests.current") == -1      # no longer handed out ...
    assert delta(s1, s2, "allocations.current") == 0            # ... but cached
    b = torch.empty(600, dtype=torch.uint8).pin_memory()        # rounds to the same 1024-byte block
    assert b.data_ptr() == pa and b.is_pinned()
    s3 = stats()
    assert delta(s2, s3, "num_host_alloc") == 0
    c = torch.empty(1025, dtype=torch.uint8, pin_memory=True)   # a 2048-byte block: a new one
    assert delta(s3, stats(), "allocated_bytes.current") == 2048
    del b, c
    torch.npu.host_empty_cache()
    s4 = stats()
    assert s4["allocations.current"] == s0["allocations.current"]
    assert delta(s0, s4, "num_host_free") == 2
    assert s4["host_free_time.count"] >= 2 and s4["host_alloc_time.count"] >= 2
    assert not torch.empty(4, dtype=torch.uint8).is_pinned()


def test_reset_peak_and_accumulated_host_memory_stats():
    x = torch.empty(1 << 16, dtype=torch.uint8, pin_memory=True)
    del x
    torch.npu.reset_peak_host_memory_stats()
    s = stats()
    assert s["active_bytes.peak"] == s["active_bytes.current"]
    assert s["allocated_bytes.peak"] == s["allocated_bytes.current"]
    torch.npu.reset_accumulated_host_memory_stats()
    s = stats()
    assert s["allocations.allocated"] == 0 and s["allocations.freed"] == 0
    assert s["host_alloc_time.count"] == 0


def test_pinned_block_reused_only_after_its_stream_passed():
    s = torch.npu.Stream()
    x = torch.ones(4096, dtype=torch.uint8, pin_memory=True)
    px = x.data_ptr()
    with HostGate(0, s.stream_id) as gate:                       # s cannot run past this point yet
        torch.npu.memory._host_record_stream(x, s)
        del x
        y = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
        assert y.data_ptr() != px, "pinned block reused while the stream that used it was still running"
        gate.open()
        s.synchronize()
    z = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
    assert z.data_ptr() == px
    with pytest.raises(ValueError, match="not pinned"):
        torch.npu.memory._host_record_stream(torch.ones(3), s)


def test_pin_memory_paths_and_non_blocking_copies():
    src = torch.arange(4096, dtype=torch.float32)
    pinned = src.pin_memory()
    assert pinned.is_pinned() and torch.equal(pinned, src)
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        dev = pinned.to("npu", non_blocking=True)
        back = torch.empty(4096, pin_memory=True)
        back.copy_(dev * 2, non_blocking=True)
    s.synchronize()
    assert torch.equal(back, src * 2)
    # DataLoader(pin_memory=True) pins batches through the same allocator.
    ds = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(16, 4))
    before = stats()["active_requests.allocated"]
    batches = list(torch.utils.data.DataLoader(ds, batch_size=8, pin_memory=True))
    assert all(b[0].is_pinned() for b in batches)
    assert stats()["active_requests.allocated"] - before >= 2
    del batches
    freed = stats()["num_host_free"]
    torch.accelerator.empty_host_cache()    # PyTorch's device-generic entry point reaches the same cache
    assert stats()["num_host_free"] >= freed + 2
