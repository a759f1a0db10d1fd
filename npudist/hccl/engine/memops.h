// Bulk copies for results that leave the engine. Large outputs are written with non-temporal (streaming)
// stores: they are not read again soon, and skipping the read-for-ownership of the destination saves a
// third of the DRAM traffic of a big collective. Internal.
#pragma once
#include <cstddef>

namespace npudist::shm::detail {

// memcpy(dst, src, bytes), with streaming stores when `stream` (non-overlapping buffers only).
void copy_out(void* dst, const void* src, size_t bytes, bool stream);
// memmove(dst, src, bytes), as copy_out when the ranges do not overlap.
void move_own(void* dst, const void* src, size_t bytes, bool stream);
// Orders earlier streaming stores before later stores (call once before an op returns).
void stream_fence();

}  // namespace npudist::shm::detail
