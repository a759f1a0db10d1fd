// Reduction kernels: one template instantiated per (dtype, op); blocks of kBlock elements accumulate in the
// dtype's accumulator type (fp32 for fp16/bf16) so inner loops are simple and vectorisable.
#include "reduce.h"

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <string>

namespace npudist::hccl::detail {
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

template <typename T> struct Cvt {
  using A = T;
  static A load(T v) { return v; }
  static T store(A a) { return a; }
};
template <> struct Cvt<Half> {
  using A = float;
  static A load(Half v) { return h2f(v.bits); }
  static Half store(A a) { return Half{f2h(a)}; }
};
template <> struct Cvt<BF16> {
  using A = float;
  static A load(BF16 v) { return bf2f(v.bits); }
  static BF16 store(A a) { return BF16{f2bf(a)}; }
};

struct OpSum { template <typename A> static A apply(A a, A b) { return a + b; } };
struct OpProd { template <typename A> static A apply(A a, A b) { return a * b; } };
struct OpMin { template <typename A> static A apply(A a, A b) { return b < a ? b : a; } };
struct OpMax { template <typename A> static A apply(A a, A b) { return a < b ? b : a; } };
struct OpBand { template <typename A> static A apply(A a, A b) { return a & b; } };
struct OpBor { template <typename A> static A apply(A a, A b) { return a | b; } };
struct OpBxor { template <typename A> static A apply(A a, A b) { return a ^ b; } };

template <typename T, typename Op>
void reduce_kernel(const void* const* srcs, int nsrc, void* dst, void* dst2, size_t count, double scale) {
  using C = Cvt<T>;
  using A = typename C::A;
  A acc[kBlock];
  const bool scaled = scale != 1.0;
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = C::load(s0[i]);
    for (int k = 1; k < nsrc; ++k) {
      const T* sk = static_cast<const T*>(srcs[k]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], C::load(sk[i]));
    }
    if constexpr (std::is_floating_point_v<A> || !std::is_integral_v<A>) {
      if (scaled) {
        const A s = static_cast<A>(scale);
        for (size_t i = 0; i < m; ++i) acc[i] = acc[i] * s;
      }
    }
    T* d = static_cast<T*>(dst) + base;
    for (size_t i = 0; i < m; ++i) d[i] = C::store(acc[i]);
    if (dst2) {
      T* d2 = static_cast<T*>(dst2) + base;
      for (size_t i = 0; i < m; ++i) d2[i] = C::store(acc[i]);
    }
  }
}

template <typename T>
void dispatch_arith(ReduceOp op, const void* const* s, int n, void* d, void* d2, size_t c, double sc) {
  switch (op) {
    case ReduceOp::kSum: return reduce_kernel<T, OpSum>(s, n, d, d2, c, sc);
    case ReduceOp::kProduct: return reduce_kernel<T, OpProd>(s, n, d, d2, c, sc);
    case ReduceOp::kMin: return reduce_kernel<T, OpMin>(s, n, d, d2, c, sc);
    case ReduceOp::kMax: return reduce_kernel<T, OpMax>(s, n, d, d2, c, sc);
    default: break;
  }
  throw EngineError(ErrorKind::kInvalidArgument, "internal: bitwise op reached arithmetic kernel");
}

template <typename T>
void dispatch_int(ReduceOp op, const void* const* s, int n, void* d, void* d2, size_t c, double sc) {
  switch (op) {
    case ReduceOp::kBand: return reduce_kernel<T, OpBand>(s, n, d, d2, c, sc);
    case ReduceOp::kBor: return reduce_kernel<T, OpBor>(s, n, d, d2, c, sc);
    case ReduceOp::kBxor: return reduce_kernel<T, OpBxor>(s, n, d, d2, c, sc);
    default: return dispatch_arith<T>(op, s, n, d, d2, c, sc);
  }
}

// bool (one byte, 0/1): sum/max/bor are "any", product/min/band are "all", bxor is parity.
void dispatch_bool(ReduceOp op, const void* const* s, int n, void* d, void* d2, size_t c) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kMax: case ReduceOp::kBor:
      return reduce_kernel<uint8_t, OpBor>(s, n, d, d2, c, 1.0);
    case ReduceOp::kProduct: case ReduceOp::kMin: case ReduceOp::kBand:
      return reduce_kernel<uint8_t, OpBand>(s, n, d, d2, c, 1.0);
    case ReduceOp::kBxor:
      return reduce_kernel<uint8_t, OpBxor>(s, n, d, d2, c, 1.0);
  }
}

template <typename T>
void dispatch_complex(ReduceOp op, const void* const* s, int n, void* d, void* d2, size_t c, double sc) {
  if (op == ReduceOp::kSum) return reduce_kernel<T, OpSum>(s, n, d, d2, c, sc);
  return reduce_kernel<T, OpProd>(s, n, d, d2, c, sc);
}

bool is_float(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}
bool is_complex(DataType t) { return t == DataType::kComplex64 || t == DataType::kComplex128; }

}  // namespace

float half_to_float(unsigned short h) { return h2f(h); }
unsigned short float_to_half(float f) { return f2h(f); }
float bf16_to_float(unsigned short h) { return bf2f(h); }
unsigned short float_to_bf16(float f) { return f2bf(f); }

void check_reduce_supported(DataType t, ReduceOp op, double scale) {
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  std::string why;
  if (bitwise && (is_float(t) || is_complex(t))) {
    why = std::string(reduce_op_name(op)) + " is only defined for integer and bool tensors, got " +
          dtype_name(t) + "; use SUM/MIN/MAX or convert the tensor to an integer dtype";
  } else if (is_complex(t) && (op == ReduceOp::kMin || op == ReduceOp::kMax)) {
    why = std::string(reduce_op_name(op)) + " is not defined for complex tensors (" + dtype_name(t) +
          "); reduce real and imaginary parts separately";
  } else if (scale != 1.0 && !is_float(t) && !is_complex(t)) {
    why = std::string("AVG/PREMUL_SUM need a floating-point or complex tensor, got ") + dtype_name(t) +
          "; use SUM and divide, or convert to a floating dtype";
  }
  if (!why.empty()) throw EngineError(ErrorKind::kInvalidArgument, "npudist engine: " + why);
}

void reduce_buffers(DataType t, ReduceOp op, const void* const* s, int n, void* d, void* d2, size_t c,
                    double sc) {
  switch (t) {
    case DataType::kFloat32: return dispatch_arith<float>(op, s, n, d, d2, c, sc);
    case DataType::kFloat64: return dispatch_arith<double>(op, s, n, d, d2, c, sc);
    case DataType::kFloat16: return dispatch_arith<Half>(op, s, n, d, d2, c, sc);
    case DataType::kBFloat16: return dispatch_arith<BF16>(op, s, n, d, d2, c, sc);
    case DataType::kInt8: return dispatch_int<int8_t>(op, s, n, d, d2, c, sc);
    case DataType::kUInt8: return dispatch_int<uint8_t>(op, s, n, d, d2, c, sc);
    case DataType::kInt16: return dispatch_int<int16_t>(op, s, n, d, d2, c, sc);
    case DataType::kInt32: return dispatch_int<int32_t>(op, s, n, d, d2, c, sc);
    case DataType::kInt64: return dispatch_int<int64_t>(op, s, n, d, d2, c, sc);
    case DataType::kBool: return dispatch_bool(op, s, n, d, d2, c);
    case DataType::kComplex64: return dispatch_complex<std::complex<float>>(op, s, n, d, d2, c, sc);
    case DataType::kComplex128: return dispatch_complex<std::complex<double>>(op, s, n, d, d2, c, sc);
  }
}

}  // namespace npudist::hccl::detail
