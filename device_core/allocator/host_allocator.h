// Pinned host memory of the npu device: a caching host allocator (docs/memory.md, "Pinned host memory").
#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

namespace pybind11 { class module_; }

namespace npudist::host_memory {

// What tensor.pin_memory(), torch.empty(..., pin_memory=True) and DataLoader(pin_memory=True) allocate from
// (also at::getHostAllocator(PrivateUse1)).
c10::Allocator* allocator();

// True for any address inside a block of the host allocator (cached blocks stay pinned).
bool is_pinned(const void* ptr);

// The block holding `ptr` (a live pinned allocation) is reused only after `stream` has run everything
// enqueued on it so far. False if `ptr` is not a pinned allocation.
bool record_stream(void* ptr, void* ctx, c10::Stream stream);

void init_bindings(pybind11::module_& m);

}  // namespace npudist::host_memory
