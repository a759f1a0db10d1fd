"""torch.npu memory API through real npu tensors: stats keys and values, empty_cache, raw alloc/delete,
stream reuse and record_stream, limits and configuration."""
import collections
import gc
import itertools
import os
import sys

import pytest
import torch

import npudist  # noqa: F401
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from runtime_ext import launch_host_fill  # noqa: E402

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _settled_allocator():
    """These tests read the allocator's counters around their own tensors. A block an earlier test on this
    xdist worker freed while a stream still used it (record_stream) stays counted until an allocation finds
    its stream passed: in CI one such block left mid-test (memory_allocated 9728 B low, a cached segment
    reused). Collect garbage, let every stream pass, and allocate once so those blocks are returned first: on
    every device, since the snapshot lists all of them and a test elsewhere may have left one on npu:1."""
    gc.collect()
    for d in range(torch.npu.device_count()):
        torch.npu.synchronize(d)
        torch.empty(1, dtype=torch.uint8, device=f"npu:{d}")
    yield

CUDA_STAT_ARRAYS = ["allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                    "active_bytes", "inactive_split_bytes", "requested_bytes"]
# torch.cuda.memory_stats keys (torch 2.13 CUDACachingAllocator DeviceStats as flattened by torch.cuda).
CUDA_KEYS = ({f"{a}.{p}.{m}" for a, p, m in itertools.product(
    CUDA_STAT_ARRAYS, ["all", "large_pool", "small_pool"], ["current", "peak", "allocated", "freed"])}
    | {f"{a}.{m}" for a in ("oversize_allocations", "oversize_segments")
       for m in ("current", "peak", "allocated", "freed")}
    | {"num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams", "num_device_alloc",
       "num_device_free", "num_oom_rejections"})


def test_stats_keys_match_cuda():
    stats = torch.npu.memory_stats()
    # Live private pools (MemPool) add reserved_bytes_by_private_pools.<a>_<b>.* keys, as in torch.cuda.
    assert {k for k in stats if not k.startswith("reserved_bytes_by_private_pools.")} == CUDA_KEYS | {
        "hccl_buffer_bytes.current"}   # npudist's own: hccl communicators' buffers (docs/hccl.md, Environment)
    assert stats["hccl_buffer_bytes.current"] == 0   # no process group here
    assert list(stats) == sorted(stats)
    nested = torch.npu.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes.all.current"]
    assert torch.npu.memory_stats(0) == torch.npu.memory_stats("npu:0") == torch.npu.memory_stats(torch.device("npu"))


def test_torch_cuda_summary_reads_npu_stats(monkeypatch):
    # PyTorch's own consumer of the key layout formats our stats without a KeyError.
    import torch.cuda.memory as cm

    monkeypatch.setattr(cm, "memory_stats", lambda device=None: torch.npu.memory_stats(0))
    monkeypatch.setattr(cm, "_get_device_index", lambda device, optional=False: 0)
    text = cm.memory_summary(0)
    assert "Allocated memory" in text and "Oversize GPU segments" in text
    ours = torch.npu.memory_summary()
    assert "PyTorch NPU memory summary, device ID 0" in ours and "NPU reserved memory" in ours


def test_allocated_counts_rounded_blocks_and_peaks():
    torch.npu.reset_peak_memory_stats()
    base = torch.npu.memory_allocated()
    x = torch.empty(1000, dtype=torch.uint8, device="npu")  # small pool, rounded to 1024
    y = torch.empty(3 * MiB + 1, dtype=torch.uint8, device="npu")  # large pool, rounded to 512 B
    s = torch.npu.memory_stats()
    assert torch.npu.memory_allocated() - base == 1024 + 3 * MiB + 512
    assert s["requested_bytes.all.current"] >= 1000 + 3 * MiB + 1
    assert torch.npu.max_memory_allocated() >= base + 1024 + 3 * MiB + 512
    del x, y
    assert torch.npu.memory_allocated() == base
    assert torch.npu.memory_reserved() >= 2 * MiB + 20 * MiB  # cached, not returned
    torch.npu.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == base
    torch.npu.reset_accumulated_memory_stats()
    s = torch.npu.memory_stats()
    assert s["allocation.all.allocated"] == 0 and s["num_device_alloc"] == 0


def test_empty_cache_releases_unused_segments():
    torch.npu.empty_cache()
    keep = torch.ones(4 * MiB, dtype=torch.uint8, device="npu")
    r0 = torch.npu.memory_reserved()
    tmp = torch.empty(30 * MiB, dtype=torch.uint8, device="npu")
    assert torch.npu.memory_reserved() == r0 + 30 * MiB
    del tmp
    assert torch.npu.memory_reserved() == r0 + 30 * MiB
    free_before, total = torch.npu.mem_get_info()
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() == r0
    assert torch.npu.mem_get_info() == (free_before + 30 * MiB, total)
    assert total == torch.npu.get_device_properties(0).total_memory
    assert int(keep.sum()) == 4 * MiB  # live memory untouched
    # torch.accelerator sees the same allocator
    assert torch.accelerator.memory_allocated(0) == torch.npu.memory_allocated(0)


def test_caching_allocator_alloc_and_delete():
    base = torch.npu.memory_allocated()
    p = torch.npu.caching_allocator_alloc(5000)
    q = torch.npu.caching_allocator_alloc(5000, device=0, stream=torch.npu.current_stream())
    assert p and q and p != q
    assert torch.npu.memory_allocated() == base + 2 * 5120
    torch.npu.caching_allocator_delete(p)
    torch.npu.caching_allocator_delete(q)
    assert torch.npu.memory_allocated() == base
    with pytest.raises(ValueError, match="not allocated by the npu caching allocator"):
        torch.npu.caching_allocator_delete(p)
    with pytest.raises(ValueError, match="Invalid npu device index"):
        torch.npu.caching_allocator_alloc(10, device=99)
    with pytest.raises(ValueError, match="npu device"):
        torch.npu.memory_allocated("cpu")


def test_blocks_are_reused_per_stream():
    n = 256 * 1024
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        a = torch.empty(n, dtype=torch.uint8, device="npu")
    pa = a.data_ptr()
    del a
    b = torch.empty(n, dtype=torch.uint8, device="npu")  # default stream: not the block freed on s
    assert b.data_ptr() != pa
    with torch.npu.stream(s):
        c = torch.empty(n, dtype=torch.uint8, device="npu")
    assert c.data_ptr() == pa


def _record_on_a_busy_stream(n):
    """A block of n bytes recorded on a side stream that is busy for ~0.3 s: (stream, busy tensor, x)."""
    s = torch.npu.Stream()
    busy = torch.zeros(16, device="npu")
    launch_host_fill(busy, 1.0, 300_000, s.stream_id)
    x = torch.empty(n, dtype=torch.uint8, device="npu")
    x.record_stream(s)  # x is (notionally) used by work queued on s
    return s, busy, x


def test_record_stream_delays_reuse_until_stream_passes():
    n = 512 * 1024
    # A cached block for x and y, so that no allocation here makes a new peak of allocated memory: before one the
    # allocator lets the device's streams catch up (docs/memory.md, DeviceHooks::before_new_peak), after which s
    # has passed and reusing x's block is right.
    spare = torch.empty(2 * n + MiB, dtype=torch.uint8, device="npu")
    del spare
    s, busy, x = _record_on_a_busy_stream(n)
    px = x.data_ptr()
    del x
    active = torch.npu.memory_stats()["active_bytes.all.current"]
    y = torch.empty(n, dtype=torch.uint8, device="npu")
    assert y.data_ptr() != px, "block reused while its stream was still running"
    s.synchronize()
    assert float(busy.sum()) == 16.0
    z = torch.empty(n, dtype=torch.uint8, device="npu")
    assert z.data_ptr() == px
    assert active >= n + torch.npu.memory_allocated() - 2 * n  # pending block stayed active
    dev = torch.npu.current_device()
    snap_states = collections.Counter(b["state"] for seg in torch.npu.memory._snapshot()["segments"]
                                      if seg["device"] == dev for b in seg["blocks"])
    assert "active_pending_free" not in snap_states


def test_empty_cache_waits_for_recorded_streams():
    n = 4 * MiB
    s = torch.npu.Stream()
    busy = torch.zeros(16, device="npu")
    x = torch.empty(n, dtype=torch.uint8, device="npu")
    launch_host_fill(busy, 2.0, 200_000, s.stream_id)
    x.record_stream(s)
    del x
    pending = [b for seg in torch.npu.memory._snapshot()["segments"] for b in seg["blocks"]
               if b["state"] == "active_pending_free"]
    assert pending, "freed block used by a busy stream should be pending"
    syncs = torch.npu.memory_stats()["num_sync_all_streams"]
    torch.npu.empty_cache()
    assert float(busy.sum()) == 32.0  # empty_cache waited for the stream
    assert torch.npu.memory_stats()["num_sync_all_streams"] == syncs + 1


def test_memory_fraction_validation():
    with pytest.raises(ValueError, match="between 0.0 and 1.0"):
        torch.npu.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError):
        torch.npu.set_per_process_memory_fraction("half")
    assert torch.npu.get_per_process_memory_fraction() == 1.0


def test_set_allocator_settings_validates():
    with pytest.raises(ValueError, match="max_split_size_mb"):
        torch.npu.memory._set_allocator_settings("max_split_size_mb:abc")
    with pytest.raises(ValueError, match="unknown option 'foo'"):
        torch.npu.memory._set_allocator_settings("foo:1")
    assert torch.npu.memory.get_allocator_backend() == "native"


def test_caching_allocator_disabled_context():
    torch.npu.empty_cache()
    r0 = torch.npu.memory_reserved()
    with torch.npu.caching_allocator_disabled():
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="npu")
        assert torch.npu.memory_reserved() == r0 + 3 * MiB  # exact segment, no 20 MiB rounding
        del x
        assert torch.npu.memory_reserved() == r0  # returned at once
    y = torch.empty(3 * MiB, dtype=torch.uint8, device="npu")
    del y
    assert torch.npu.memory_reserved() == r0 + 20 * MiB  # caching again
    torch.npu.empty_cache()


def test_erase_stream_returns_the_block_at_its_free():
    # torch_npu.erase_stream after the tensor's stream waited for the side stream: the block is reused at once,
    # where record_stream alone keeps it out until the side stream passes (the test above).
    import torch_npu
    n = 512 * 1024
    s, busy, x = _record_on_a_busy_stream(n)
    px = x.data_ptr()
    torch.npu.current_stream().wait_stream(s)  # what erase_stream's contract asks for
    torch_npu.erase_stream(x, s)
    del x
    y = torch.empty(n, dtype=torch.uint8, device="npu")
    assert y.data_ptr() == px, "the erased stream still held the block"
    torch.npu.synchronize()
    assert float(busy.sum()) == 16.0


def test_erase_stream_rejects_what_it_cannot_erase():
    import torch_npu
    x = torch.empty(4, device="npu")
    with pytest.raises(TypeError, match="torch.npu.Stream"):
        torch_npu.erase_stream(x, 0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        torch_npu.erase_stream([1.0], torch.npu.current_stream())
    with pytest.raises(ValueError, match="expected an npu tensor"):
        torch_npu.erase_stream(torch.empty(4), torch.npu.current_stream())
