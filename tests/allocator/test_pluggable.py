"""NPUPluggableAllocator + change_current_allocator with a small allocator compiled here."""

import pytest
import torch

import npudist  # noqa: F401
from _subproc import build_allocator_library, check_snippet, run_snippet

ALLOCATOR_C = r"""
#include <stdint.h>
#include <stdlib.h>
static long n_alloc, n_free, live;
static int last_device = -1;
static intptr_t last_stream = -1;
void* counting_alloc(size_t size, int device, void* stream) {
  void* p = aligned_alloc(64, (size + 63) / 64 * 64);
  if (p) { n_alloc++; live += (long)size; last_device = device; last_stream = (intptr_t)stream; }
  return p;
}
void counting_free(void* ptr, size_t size, int device, void* stream) {
  (void)device; (void)stream;
  n_free++; live -= (long)size; free(ptr);
}
long alloc_count(void) { return n_alloc; }
long free_count(void) { return n_free; }
long live_bytes(void) { return live; }
int alloc_device(void) { return last_device; }
long alloc_stream(void) { return (long)last_stream; }
"""


@pytest.fixture(scope="module")
def allocator_so(tmp_path_factory):
    return build_allocator_library(tmp_path_factory, "counting", ALLOCATOR_C)


def test_pluggable_allocator_serves_npu_tensors(allocator_so):
    out = check_snippet(f"""
        import ctypes, torch, npudist
        so = {allocator_so!r}
        torch.npu.memory.change_current_allocator(torch.npu.memory.NPUPluggableAllocator(so, "counting_alloc", "counting_free"))
        lib = ctypes.CDLL(so)
        print("BACKEND", torch.npu.memory.get_allocator_backend())
        x = torch.ones(1000, device="npu")
        y = x * 3 + 1                                  # kernel outputs come from the pluggable allocator too
        print("SUM", float(y.sum()))
        print("LIVE", lib.live_bytes() >= 8000, lib.alloc_count() >= 2)
        s = torch.npu.Stream(device=1)
        with torch.npu.stream(s):
            z = torch.empty(10, device="npu:1")
        print("WHERE", lib.alloc_device(), lib.alloc_stream() == s.stream_id)
        z.record_stream(torch.npu.current_stream())    # ignored for pluggable memory
        del x, y, z
        print("FREED", lib.live_bytes(), lib.free_count() == lib.alloc_count())
        try:
            torch.npu.memory_stats()
        except RuntimeError as e:
            print("STATS", "pluggable allocator" in str(e))
        p = torch.npu.caching_allocator_alloc(100)
        torch.npu.caching_allocator_delete(p)
        print("RAW", lib.live_bytes())
    """, {"NPUDIST_DEVICE_COUNT": "2"})
    assert "BACKEND pluggable" in out
    assert "SUM 4000.0" in out
    assert "LIVE True True" in out
    assert "WHERE 1 True" in out
    assert "FREED 0 True" in out
    assert "STATS True" in out
    assert "RAW 0" in out


def test_swap_after_first_allocation_is_refused(allocator_so):
    res = run_snippet(f"""
        import torch, npudist
        x = torch.ones(4, device="npu")
        torch.npu.memory.change_current_allocator(
            torch.npu.memory.NPUPluggableAllocator({allocator_so!r}, "counting_alloc", "counting_free"))
    """)
    assert res.returncode != 0 and "can't swap an already initialized allocator" in res.stderr


def test_bad_library_or_symbol(allocator_so, tmp_path):
    with pytest.raises(ValueError, match="cannot load"):
        torch.npu.memory.NPUPluggableAllocator(str(tmp_path / "missing.so"), "a", "b")
    with pytest.raises(ValueError, match="does not export 'nope'"):
        torch.npu.memory.NPUPluggableAllocator(allocator_so, "counting_alloc", "nope")
    with pytest.raises(TypeError):
        torch.npu.memory.change_current_allocator(object())
