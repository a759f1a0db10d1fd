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

// Tensor.record_stream: the block behind data_ptr must not be reused until `stream` has passed the
// point where this was called.
void record_stream(const c10::DataPtr& data_ptr, c10::Stream stream);

// Register the memory functions (stats, empty_cache, snapshots, ...) on the extension module.
void init_bindings(pybind11::module_& m);

}  // namespace npudist::memory
