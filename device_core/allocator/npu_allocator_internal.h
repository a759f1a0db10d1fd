// What the torch adapter's three files share (npu_caching_allocator.cpp: the c10 allocator, pluggable switch and
// stream tracking; swapped_memory.cpp; npu_allocator_bindings.cpp: torch.npu.memory's bindings). Private to
// device_core/allocator/: the rest of device_core sees npu_allocator.h only.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "caching_allocator.h"

struct _object;
typedef _object PyObject;  // as Python.h declares it

namespace npudist::memory::detail {

// The core, created on first use (device configuration and PYTORCH_NPU_ALLOC_CONF are read then).
alloc::CachingAllocator* core();
bool core_created();
// Set by the first npu allocation or pool use: the allocator can no longer be swapped for a pluggable one.
void mark_used();
bool used();

// Stack capture for _record_memory_history: 0 none, 1 state, 2 alloc, 3 all (also on free); `cpp` adds C++ frames.
void set_context_capture(int level, bool cpp);

// The pluggable allocator (NPUPluggableAllocator / MemPool(allocator=...)): functions from a user .so.
using PlugAlloc = void* (*)(size_t size, int device, void* stream);
using PlugFree = void (*)(void* ptr, size_t size, int device, void* stream);
void* stream_handle(int64_t id);
bool pluggable_active();
// Refuses once npu memory was allocated (the caching allocator's blocks would be freed through the new functions).
void change_current_allocator(PlugAlloc alloc_fn, PlugFree free_fn);

// The deallocation hook of the stream sanitizer: raw_delete calls hook(data_ptr, stream_id) before a live block is
// freed (stream_id: the stream whose pool it returns to). nullptr removes it. Call with the GIL held.
void set_free_hook(PyObject* hook);
PyObject* free_hook();  // borrowed; call with the GIL held

void* raw_alloc(size_t n, int device, int64_t stream);
void raw_delete(void* ptr);
void empty_cache();  // finished kernels first (launch.h), so what they held is returned too
void erase_stream(const at::Tensor& tensor, c10::Stream stream);

// Errors as torch.npu reports them: a statistic of the caching allocator while a pluggable one serves; a bad index.
void check_native(const char* what);
void check_device(int device);

// Swapped memory (torch_npu.empty_with_swapped_memory), swapped_memory.cpp.
at::Tensor empty_with_swapped_memory(const std::vector<int64_t>& sizes, c10::ScalarType dtype, int device);
bool is_swapped(const at::Tensor& t);
int64_t swapped_bytes();

}  // namespace npudist::memory::detail
