// The allocator behind every npu tensor. device_core/ code depends only on this header; the
// implementation (caching allocator, stats, snapshots, Python bindings) lives in device_core/allocator/.
#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

namespace pybind11 { class module_; }

namespace npudist::memory {

// The c10::Allocator for PrivateUse1 (also what `at::empty(..., device=npu)` and storage resize use).
// Allocates on the device of the current npu device guard, associated with that device's current stream.
c10::Allocator* allocator();

// True if `ptr` is a live allocation of the npu allocator (what allocator()->raw_deleter() frees).
bool owns(void* ptr);

// Makes the caching allocator order the reuse of the memory behind data_ptr after the work queued on `stream`
// so far, and returns whether it could, i.e. whether a kernel queued on `stream` may reference that memory
// without holding it: true for a block of the caching allocator (caching on). A block of that stream, freed by
// the host, returns to the stream's pool at once and is handed to the stream's next allocation, whose work runs
// after the queued kernel because the stream runs in order. For another stream's block the call records the use
// as Tensor.record_stream(stream) does: freed by the host, it is reused only once `stream` ran what was queued
// before the free. Either way the segment leaves the allocator only after the device's streams ran
// (DeviceHooks::synchronize_device). Any other memory (swapped or pluggable allocations, caching off) must be
// held by the kernel until it ran.
bool order_reuse_after(const c10::DataPtr& data_ptr, int64_t stream);

// Tensor.record_stream: the block behind data_ptr must not be reused until `stream` has passed the
// point where this was called.
void record_stream(const c10::DataPtr& data_ptr, c10::Stream stream);

// Register the memory functions (stats, empty_cache, snapshots, ...) on the extension module.
void init_bindings(pybind11::module_& m);

}  // namespace npudist::memory
