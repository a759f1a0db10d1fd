// Element-wise reductions over raw buffers for every engine dtype. fp16/bf16 accumulate in fp32 across all
// inputs and round once. Loops work on fixed-size blocks so the compiler vectorises them. Internal.
#pragma once
#include <cstddef>

#include "engine.h"

namespace npudist::shm::detail {

// Throws CommError(kInvalidArgument) when `op` (or a non-unit `scale`) is not defined for `t`.
void check_reduce_supported(ElementType t, Reduction op, double scale);

// dst[i] = (srcs[0][i] op ... op srcs[n-1][i]) * scale for i < count; also stored to dst2 when non-null.
// dst/dst2 may alias any source at the same positions (each block is read fully before it is stored).
// `stream_dst`: write dst with streaming stores (large outputs; see memops.h).
void reduce_buffers(ElementType t, Reduction op, const void* const* srcs, int nsrc, void* dst, void* dst2,
                    size_t count, double scale, bool stream_dst = false);

// Bit-exact conversions used by the kernels (exposed for tests and benchmarks).
float half_to_float(unsigned short h);
unsigned short float_to_half(float f);
float bf16_to_float(unsigned short h);
unsigned short float_to_bf16(float f);

}  // namespace npudist::shm::detail
