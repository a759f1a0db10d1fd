// The reduction kernels compiled for AVX2 + FMA + F16C (fp16 converts in hardware); reduce.cpp picks them
// at run time when the CPU supports them.
#if defined(__x86_64__)
#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#include "engine.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define NPUDIST_HW_F16 1
#define NPUDIST_KERNEL_NS avx2
#include "reduce_kernels.h"
#undef NPUDIST_KERNEL_NS
#undef NPUDIST_HW_F16
#pragma GCC pop_options
#endif
