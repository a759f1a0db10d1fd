// Reduction kernel templates, included by reduce.cpp (baseline ISA) and reduce_avx2.cpp (AVX2 + F16C, chosen
// at run time). Each defines NPUDIST_KERNEL_NS before including. Internal.
#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine.h"
#include "memops.h"

namespace npudist::shm::detail::NPUDIST_KERNEL_NS {
namespace {

constexpr size_t kBlock = 512;

inline uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// IEEE half -> float: move exponent/mantissa into place and rescale by 2^112, which also normalises
// subnormals; infinities/NaNs get the all-ones exponent.
inline float h2f(uint16_t h) {
  uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
  float f = u2f(em) * u2f(0x77800000u);  // 2^112
  uint32_t bits = f2u(f);
  if ((h & 0x7c00u) == 0x7c00u) bits |= 0x7f800000u;
  return u2f(bits | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// float -> IEEE half, round to nearest even; overflow to inf, NaN stays NaN, subnormals via an
// addition that lets the FPU do the rounding.
inline uint16_t f2h(float f) {
  uint32_t u = f2u(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint16_t out;
  if (u >= 0x47800000u) {  // >= 65536 (beyond half range) or inf/nan
    out = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    float g = u2f(u) + u2f(0x3f000000u);  // + 0.5 aligns the half-subnormal ulp to the float ulp
    out = static_cast<uint16_t>(f2u(g) - 0x3f000000u);
  } else {
    uint32_t odd = (u >> 13) & 1u;
    u += 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and round half to even
    out = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(out | sign);
}

inline float bf2f(uint16_t h) { return u2f(static_cast<uint32_t>(h) << 16); }
inline uint16_t f2bf(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct Half { uint16_t bits; };
struct BF16 { uint16_t bits; };

// Block conversions between the stored type T and the accumulator type A (identity for most types).
template <typename T> struct Cvt {
  using A = T;
  static constexpr bool kConvert = false;
  static void load(const T* s, A* d, size_t m) { std::memcpy(d, s, m * sizeof(T)); }
  static void store(const A* s, T* d, size_t m) { std::memcpy(d, s, m * sizeof(T)); }
};
#if defined(NPUDIST_HW_F16)
// F16C converts 8 halves per instruction (GCC 12 does not vectorise _Float16 conversions itself).
template <> struct Cvt<Half> {
  using A = float;
  static constexpr bool kConvert = true;
  static void load(const Half* s, A* d, size_t m) {
    size_t i = 0;
    for (; i + 8 <= m; i += 8)
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    for (; i < m; ++i) d[i] = h2f(s[i].bits);
  }
  static void store(const A* s, Half* d, size_t m) {
    size_t i = 0;
    for (; i + 8 <= m; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < m; ++i) d[i].bits = f2h(s[i]);
  }
};
#else
template <> struct Cvt<Half> {
  using A = float;
  static constexpr bool kConvert = true;
  static void load(const Half* s, A* d, size_t m) { for (size_t i = 0; i < m; ++i) d[i] = h2f(s[i].bits); }
  static void store(const A* s, Half* d, size_t m) { for (size_t i = 0; i < m; ++i) d[i].bits = f2h(s[i]); }
};
#endif
template <> struct Cvt<BF16> {
  using A = float;
  static constexpr bool kConvert = true;
  static void load(const BF16* s, A* d, size_t m) { for (size_t i = 0; i < m; ++i) d[i] = bf2f(s[i].bits); }
  static void store(const A* s, BF16* d, size_t m) { for (size_t i = 0; i < m; ++i) d[i].bits = f2bf(s[i]); }
};

struct OpSum { template <typename A> static A apply(A a, A b) { return a + b; } };
struct OpProd { template <typename A> static A apply(A a, A b) { return a * b; } };
struct OpMin { template <typename A> static A apply(A a, A b) { return b < a ? b : a; } };
struct OpMax { template <typename A> static A apply(A a, A b) { return a < b ? b : a; } };
struct OpBand { template <typename A> static A apply(A a, A b) { return a & b; } };
struct OpBor { template <typename A> static A apply(A a, A b) { return a | b; } };
struct OpBxor { template <typename A> static A apply(A a, A b) { return a ^ b; } };

// Sources are read through `view`: in place for plain types, converted into an L1-resident block for
// fp16/bf16. Every loop is a simple elementwise array loop the compiler vectorises.
template <typename T, typename Op>
void reduce_kernel(const void* const* srcs, int nsrc, void* dst, void* dst2, size_t count, double scale,
                   bool stream) {
  using C = Cvt<T>;
  using A = typename C::A;
  alignas(64) A acc[kBlock];
  alignas(64) A t0[C::kConvert ? kBlock : 1];
  alignas(64) A t1[C::kConvert ? kBlock : 1];
  auto view = [&](int k, size_t base, size_t m, A* tmp) -> const A* {
    const T* p = static_cast<const T*>(srcs[k]) + base;
    if constexpr (C::kConvert) {
      C::load(p, tmp, m);
      return tmp;
    } else {
      (void)tmp;
      return reinterpret_cast<const A*>(p);
    }
  };
  const bool scaled = scale != 1.0;
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const A* x = view(0, base, m, t0);
    if (nsrc >= 2) {
      const A* y = view(1, base, m, t1);
      for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(x[i], y[i]);
    } else {
      for (size_t i = 0; i < m; ++i) acc[i] = x[i];
    }
    for (int k = 2; k < nsrc; ++k) {
      const A* z = view(k, base, m, t1);
      for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], z[i]);
    }
    if constexpr (std::is_floating_point_v<A> || !std::is_integral_v<A>) {
      if (scaled) {
        const A sc = static_cast<A>(scale);
        for (size_t i = 0; i < m; ++i) acc[i] = acc[i] * sc;
      }
    }
    if (stream) {
      if constexpr (C::kConvert) {
        C::store(acc, reinterpret_cast<T*>(t0), m);  // t0 is free again and large enough
        copy_out(static_cast<T*>(dst) + base, t0, m * sizeof(T), true);
      } else {
        copy_out(static_cast<T*>(dst) + base, acc, m * sizeof(T), true);
      }
    } else {
      C::store(acc, static_cast<T*>(dst) + base, m);
    }
    if (dst2) C::store(acc, static_cast<T*>(dst2) + base, m);
  }
}

template <typename T>
void dispatch_arith(Reduction op, const void* const* s, int n, void* d, void* d2, size_t c, double sc, bool st) {
  switch (op) {
    case Reduction::kSum: return reduce_kernel<T, OpSum>(s, n, d, d2, c, sc, st);
    case Reduction::kProduct: return reduce_kernel<T, OpProd>(s, n, d, d2, c, sc, st);
    case Reduction::kMin: return reduce_kernel<T, OpMin>(s, n, d, d2, c, sc, st);
    case Reduction::kMax: return reduce_kernel<T, OpMax>(s, n, d, d2, c, sc, st);
    default: break;
  }
  throw CommError(FailureKind::kInvalidArgument, "internal: bitwise op reached arithmetic kernel");
}

template <typename T>
void dispatch_int(Reduction op, const void* const* s, int n, void* d, void* d2, size_t c, double sc, bool st) {
  switch (op) {
    case Reduction::kBand: return reduce_kernel<T, OpBand>(s, n, d, d2, c, sc, st);
    case Reduction::kBor: return reduce_kernel<T, OpBor>(s, n, d, d2, c, sc, st);
    case Reduction::kBxor: return reduce_kernel<T, OpBxor>(s, n, d, d2, c, sc, st);
    default: return dispatch_arith<T>(op, s, n, d, d2, c, sc, st);
  }
}

// bool (one byte, 0/1): sum/max/bor are "any", product/min/band are "all", bxor is parity.
void dispatch_bool(Reduction op, const void* const* s, int n, void* d, void* d2, size_t c, bool st) {
  switch (op) {
    case Reduction::kSum: case Reduction::kMax: case Reduction::kBor:
      return reduce_kernel<uint8_t, OpBor>(s, n, d, d2, c, 1.0, st);
    case Reduction::kProduct: case Reduction::kMin: case Reduction::kBand:
      return reduce_kernel<uint8_t, OpBand>(s, n, d, d2, c, 1.0, st);
    case Reduction::kBxor:
      return reduce_kernel<uint8_t, OpBxor>(s, n, d, d2, c, 1.0, st);
  }
}

template <typename T>
void dispatch_complex(Reduction op, const void* const* s, int n, void* d, void* d2, size_t c, double sc, bool st) {
  if (op == Reduction::kSum) return reduce_kernel<T, OpSum>(s, n, d, d2, c, sc, st);
  return reduce_kernel<T, OpProd>(s, n, d, d2, c, sc, st);
}

}  // namespace

void reduce_buffers(ElementType t, Reduction op, const void* const* s, int n, void* d, void* d2, size_t c,
                    double sc, bool st) {
  switch (t) {
    case ElementType::kFloat32: return dispatch_arith<float>(op, s, n, d, d2, c, sc, st);
    case ElementType::kFloat64: return dispatch_arith<double>(op, s, n, d, d2, c, sc, st);
    case ElementType::kFloat16: return dispatch_arith<Half>(op, s, n, d, d2, c, sc, st);
    case ElementType::kBFloat16: return dispatch_arith<BF16>(op, s, n, d, d2, c, sc, st);
    case ElementType::kInt8: return dispatch_int<int8_t>(op, s, n, d, d2, c, sc, st);
    case ElementType::kUInt8: return dispatch_int<uint8_t>(op, s, n, d, d2, c, sc, st);
    case ElementType::kInt16: return dispatch_int<int16_t>(op, s, n, d, d2, c, sc, st);
    case ElementType::kInt32: return dispatch_int<int32_t>(op, s, n, d, d2, c, sc, st);
    case ElementType::kInt64: return dispatch_int<int64_t>(op, s, n, d, d2, c, sc, st);
    case ElementType::kBool: return dispatch_bool(op, s, n, d, d2, c, st);
    case ElementType::kComplex64: return dispatch_complex<std::complex<float>>(op, s, n, d, d2, c, sc, st);
    case ElementType::kComplex128: return dispatch_complex<std::complex<double>>(op, s, n, d, d2, c, sc, st);
  }
}

}  // namespace npudist::shm::detail::NPUDIST_KERNEL_NS
