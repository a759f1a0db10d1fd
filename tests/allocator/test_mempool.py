"""torch.npu.MemPool / use_mem_pool, modelled on PyTorch's test_cuda.py MemPool tests (test_mempool_id,
test_mempool_context, test_mempool_multithread, test_mempool_empty_cache, test_mempool_with_allocator) on the
caching allocator's private pools."""
import threading

import pytest
import torch

import npudist  # noqa: F401
from _subproc import build_allocator_library, run_snippet

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _return_pool_memory():
    # Pools these tests drop are forgotten at the next empty_cache; do it now so later tests in this worker
    # see no leftover pool segments or reserved_bytes_by_private_pools keys.
    yield
    torch.npu.empty_cache()


def pool_ptrs(pool):
    """[start, end) of every segment of the pool."""
    return [(s["address"], s["address"] + s["total_size"]) for s in pool.snapshot()]


def in_pool(pool, t):
    return any(a <= t.data_ptr() < b for a, b in pool_ptrs(pool))


def test_mempool_id():
    a, b = torch.npu.MemPool(), torch.npu.MemPool()
    assert a.id[0] == b.id[0] == 0
    assert b.id[1] > a.id[1] > 0
    assert torch.npu.MemPool is torch.npu.memory.MemPool


def test_mempool_context_routes_allocations_and_counts_uses():
    pool = torch.npu.MemPool()
    assert pool.use_count() == 1 and pool.allocator is None
    with torch.npu.use_mem_pool(pool):
        assert pool.use_count() == 2
        x = torch.randn(1000, device="npu")
        big = torch.empty(3 * MiB, dtype=torch.uint8, device="npu")
        y = x * 2 + 1                                    # kernel outputs are allocations too
    assert pool.use_count() == 1
    assert in_pool(pool, x) and in_pool(pool, big) and in_pool(pool, y)
    assert {s["segment_pool_id"] for s in pool.snapshot()} == {pool.id}
    assert {s["segment_type"] for s in pool.snapshot()} == {"small", "large"}
    px = x.data_ptr()
    del x
    # The freed pool block is cached in the pool: a same-size allocation outside does not get it.
    z = torch.randn(1000, device="npu")
    assert z.data_ptr() != px and not in_pool(pool, z)
    # ... while one routed to the pool again does.
    with torch.npu.use_mem_pool(pool):
        w = torch.randn(1000, device="npu")
    assert w.data_ptr() == px
    # Pool reservations are reported per pool and counted in the totals.
    stats = torch.npu.memory_stats()
    key = f"reserved_bytes_by_private_pools.{pool.id[0]}_{pool.id[1]}.all.current"
    assert stats[key] == sum(b - a for a, b in pool_ptrs(pool)) >= 20 * MiB
    assert stats["reserved_bytes.all.current"] >= stats[key]
    nested = torch.npu.memory_stats_as_nested_dict()["reserved_bytes_by_private_pools"]
    assert nested[pool.id]["all"]["current"] == stats[key]
    del y, big, w, z


def test_mempool_memory_released_when_pool_and_tensors_are_gone():
    pool = torch.npu.MemPool()
    pid = pool.id
    with torch.npu.use_mem_pool(pool):
        keep = torch.ones(5 * MiB, dtype=torch.uint8, device="npu")
        scratch = torch.ones(1000, device="npu")
    del scratch
    torch.npu.empty_cache()                # the pool is in use: its cached small segment stays
    assert len(pool.snapshot()) == 2
    del pool                               # its owner is gone; the live tensor keeps its segment
    torch.npu.empty_cache()
    by_pool = torch.npu.memory_stats_as_nested_dict()["reserved_bytes_by_private_pools"]
    assert by_pool[pid]["all"]["current"] == 20 * MiB
    assert int(keep.sum()) == 5 * MiB
    reserved = torch.npu.memory_reserved()
    del keep
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() <= reserved - 20 * MiB
    assert pid not in torch.npu.memory_stats_as_nested_dict()["reserved_bytes_by_private_pools"]
    assert torch.npu.memory.memory_snapshot(pid) == []


def test_mempool_routes_only_the_current_thread_and_device():
    pool = torch.npu.MemPool()
    other = {}
    with torch.npu.use_mem_pool(pool):
        mine = torch.empty(100, device="npu")
        t = threading.Thread(target=lambda: other.setdefault("t", torch.empty(100, device="npu")))
        t.start()
        t.join(timeout=60)
        on_dev1 = torch.empty(100, device="npu:1")   # the pool was entered for npu:0
    assert in_pool(pool, mine)
    assert not in_pool(pool, other["t"]) and not in_pool(pool, on_dev1)
    with torch.npu.use_mem_pool(pool, device="npu:1"):
        routed = torch.empty(100, device="npu:1")
    assert any(s["device"] == 1 and s["address"] <= routed.data_ptr() < s["address"] + s["total_size"]
               for s in pool.snapshot())
    assert pool.use_count() == 1


def test_mempool_multithread():
    # Threads each route to their own pool at the same time (test_mempool_multithread in test_cuda.py).
    results, errors = {}, []

    def work(i):
        try:
            pool = torch.npu.MemPool()
            with torch.npu.use_mem_pool(pool):
                t = torch.full((256,), float(i), device="npu")
            results[i] = (pool.id, in_pool(pool, t), float(t.sum()))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len({r[0] for r in results.values()}) == 4
    assert all(r[1] and r[2] == 256.0 * i for i, r in results.items())


def test_mempool_errors():
    pool = torch.npu.MemPool()
    with pytest.raises(TypeError, match="MemPool"):
        with torch.npu.use_mem_pool((0, 1)):
            pass
    with pytest.raises(TypeError, match="NPUPluggableAllocator"):
        torch.npu.MemPool(allocator=object())
    with torch.npu.use_mem_pool(pool):
        with pytest.raises(ValueError, match="already go to pool"):
            with torch.npu.use_mem_pool(pool):
                pass
    assert pool.use_count() == 1
    with pytest.raises(ValueError, match="Invalid npu device index"):
        with torch.npu.use_mem_pool(pool, device=99):
            pass


ALLOCATOR_C = r"""
#include <stdlib.h>
static long n_alloc, n_free, live;
void* pool_alloc(size_t size, int device, void* stream) {
  (void)device; (void)stream;
  void* p = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (p) { n_alloc++; live += (long)size; }
  return p;
}
void pool_free(void* ptr, size_t size, int device, void* stream) {
  (void)device; (void)stream; n_free++; live -= (long)size; free(ptr);
}
long alloc_count(void) { return n_alloc; }
long free_count(void) { return n_free; }
long live_bytes(void) { return live; }
"""


@pytest.fixture(scope="module")
def allocator_so(tmp_path_factory):
    return build_allocator_library(tmp_path_factory, "poolalloc", ALLOCATOR_C)


def test_mempool_with_pluggable_allocator(allocator_so):
    import ctypes

    alloc = torch.npu.memory.NPUPluggableAllocator(allocator_so, "pool_alloc", "pool_free")
    lib = ctypes.CDLL(allocator_so)
    pool = torch.npu.MemPool(allocator=alloc)
    assert pool.allocator is alloc
    with torch.npu.use_mem_pool(pool):
        a = torch.arange(1000, dtype=torch.float32, device="npu")
        b = torch.arange(1000, dtype=torch.float32, device="npu") * 2   # same segment, split
    assert lib.alloc_count() == 1 and lib.live_bytes() == 2 * MiB      # one small segment from the library
    assert torch.equal((a + b).cpu(), torch.arange(1000, dtype=torch.float32) * 3)
    assert in_pool(pool, a) and in_pool(pool, b)
    assert torch.npu.memory_stats()["allocated_bytes.all.current"] >= 8000  # the caching stats still work
    del a, b, pool
    torch.npu.empty_cache()
    assert lib.free_count() == lib.alloc_count() and lib.live_bytes() == 0


def test_mempool_refused_while_a_pluggable_allocator_serves_everything(allocator_so):
    res = run_snippet(f"""
        import torch, npudist
        torch.npu.memory.change_current_allocator(
            torch.npu.memory.NPUPluggableAllocator({allocator_so!r}, "pool_alloc", "pool_free"))
        try:
            torch.npu.MemPool()
        except RuntimeError as e:
            print("REFUSED", "pluggable allocator" in str(e) and "MemPool(allocator=" in str(e))
    """, timeout=120)
    assert "REFUSED True" in res.stdout, res.stdout + res.stderr
