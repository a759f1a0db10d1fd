// Reduction kernels: one template instantiated per (dtype, op); blocks of kBlock elements accumulate in the
// dtype's accumulator type (fp32 for fp16/bf16) so inner loops are simple and vectorisable.
#include "reduce.h"

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <string>

#define NPUDIST_KERNEL_NS generic
#include "reduce_kernels.h"
#undef NPUDIST_KERNEL_NS

namespace npudist::shm::detail {
#if defined(__x86_64__)
namespace avx2 {
void reduce_buffers(ElementType t, Reduction op, const void* const* s, int n, void* d, void* d2, size_t c, double sc,
                    bool stream);
}

#endif
namespace {

bool is_float(ElementType t) {
  return t == ElementType::kFloat32 || t == ElementType::kFloat64 || t == ElementType::kFloat16 ||
         t == ElementType::kBFloat16;
}
bool is_complex(ElementType t) { return t == ElementType::kComplex64 || t == ElementType::kComplex128; }

}  // namespace

float half_to_float(unsigned short h) { return generic::h2f(h); }
unsigned short float_to_half(float f) { return generic::f2h(f); }
float bf16_to_float(unsigned short h) { return generic::bf2f(h); }
unsigned short float_to_bf16(float f) { return generic::f2bf(f); }

void check_reduce_supported(ElementType t, Reduction op, double scale) {
  const bool bitwise = op == Reduction::kBand || op == Reduction::kBor || op == Reduction::kBxor;
  std::string why;
  if (bitwise && (is_float(t) || is_complex(t))) {
    why = std::string(reduction_name(op)) + " is only defined for integer and bool tensors, got " +
          element_type_name(t) + "; use SUM/MIN/MAX or convert the tensor to an integer dtype";
  } else if (is_complex(t) && (op == Reduction::kMin || op == Reduction::kMax)) {
    why = std::string(reduction_name(op)) + " is not defined for complex tensors (" + element_type_name(t) +
          "); reduce real and imaginary parts separately";
  } else if (scale != 1.0 && !is_float(t) && !is_complex(t)) {
    why = std::string("AVG/PREMUL_SUM need a floating-point or complex tensor, got ") + element_type_name(t) +
          "; use SUM and divide, or convert to a floating dtype";
  }
  if (!why.empty()) throw CommError(FailureKind::kInvalidArgument, "npudist engine: " + why);
}

void reduce_buffers(ElementType t, Reduction op, const void* const* s, int n, void* d, void* d2, size_t c,
                    double sc, bool stream) {
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                         __builtin_cpu_supports("fma") && !std::getenv("NPUDIST_ENGINE_NO_AVX2");
  if (hw) return avx2::reduce_buffers(t, op, s, n, d, d2, c, sc, stream);
#endif
  return generic::reduce_buffers(t, op, s, n, d, d2, c, sc, stream);
}

}  // namespace npudist::shm::detail
