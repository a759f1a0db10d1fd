// Shared helpers of the engine test driver: a file-based Bootstrap, argument parsing, deterministic inputs
// and a reference reduction computed independently of the engine (double/int64 arithmetic, _Float16).
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"

namespace drv {
using namespace npudist::shm;

struct Args {
  int rank = 0, size = 1;
  std::string dir, name, test;
  size_t buffer = 16 << 10;
  int timeout_ms = 20000;
};

inline Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank") a.rank = std::stoi(v);
    else if (k == "--size") a.size = std::stoi(v);
    else if (k == "--dir") a.dir = v;
    else if (k == "--name") a.name = v;
    else if (k == "--test") a.test = v;
    else if (k == "--buffer") a.buffer = std::stoul(v);
    else if (k == "--timeout-ms") a.timeout_ms = std::stoi(v);
    else throw std::invalid_argument("unknown option " + k);
  }
  return a;
}

// Keys become files in a directory; set() renames into place so get() never sees partial values.
struct FileBootstrap : Bootstrap {
  std::string dir;
  int timeout_ms;
  FileBootstrap(std::string d, int t) : dir(std::move(d)), timeout_ms(t) {}
  std::string path(const std::string& key) {
    std::string s;
    for (char c : key) s += (c == '/' ? '_' : c);
    return dir + "/" + s;
  }
  void set(const std::string& key, const std::string& value) override {
    std::string p = path(key), tmp = p + ".tmp" + std::to_string(getpid());
    { std::ofstream f(tmp); f << value; }
    std::rename(tmp.c_str(), p.c_str());
  }
  std::string get(const std::string& key) override {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string p = path(key);
    while (std::chrono::steady_clock::now() < end) {
      std::ifstream f(p);
      if (f) { std::stringstream ss; ss << f.rdbuf(); return ss.str(); }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    throw std::runtime_error("bootstrap key " + key + " not set in time");
  }
};

inline std::unique_ptr<ShmEngine> connect(const Args& a, const std::string& suffix = "") {
  CommConfig cfg;
  cfg.name = a.name + suffix;
  cfg.rank = a.rank;
  cfg.size = a.size;
  cfg.buffer_bytes = a.buffer;
  cfg.timeout = std::chrono::milliseconds(a.timeout_ms);
  FileBootstrap bs(a.dir, a.timeout_ms);
  return ShmEngine::connect(cfg, bs);
}

#define CHECK(cond, msg)                                                                          \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::ostringstream os_;                                                                     \
      os_ << __FILE__ << ":" << __LINE__ << ": " << msg;                                          \
      throw std::runtime_error(os_.str());                                                        \
    }                                                                                             \
  } while (0)

// ---- deterministic values (small integers: exact in every dtype, so summation order cannot matter) ----
inline bool is_float(ElementType t) {
  return t == ElementType::kFloat32 || t == ElementType::kFloat64 || t == ElementType::kFloat16 || t == ElementType::kBFloat16;
}
inline bool is_complex(ElementType t) { return t == ElementType::kComplex64 || t == ElementType::kComplex128; }
inline bool is_unsigned(ElementType t) { return t == ElementType::kUInt8 || t == ElementType::kBool; }

// Value of element i on rank r. `big` adds 2048 on rank 0 every 13th element: with fp16 that makes
// fp32 accumulation observable (fp16 accumulation would round 2048 + 1 back to 2048).
inline std::complex<double> gen(ElementType t, int r, size_t i, int salt, bool big) {
  long v = static_cast<long>((i * 7 + r * 3 + salt * 5) % 11);
  if (t == ElementType::kBool) return (i + r + salt) % 3 == 0 ? 1 : 0;
  if (!is_unsigned(t)) v -= 5;
  double re = static_cast<double>(v);
  if (big && r == 0 && i % 13 == 0 && is_float(t)) re += 2048;
  double im = is_complex(t) ? static_cast<double>(static_cast<long>((i * 3 + r * 5 + salt) % 7) - 3) : 0;
  return {re, im};
}

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

// Stores v into element i of buf as dtype t (integers wrap like C casts of the int64 value).
inline void store(ElementType t, void* buf, size_t i, std::complex<double> v) {
  double re = v.real();
  switch (t) {
    case ElementType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(re); break;
    case ElementType::kFloat64: static_cast<double*>(buf)[i] = re; break;
    case ElementType::kFloat16: {
      _Float16 h = static_cast<_Float16>(static_cast<float>(re));
      std::memcpy(static_cast<char*>(buf) + 2 * i, &h, 2);
      break;
    }
    case ElementType::kBFloat16: static_cast<uint16_t*>(buf)[i] = to_bf16(static_cast<float>(re)); break;
    case ElementType::kInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(static_cast<int64_t>(re)); break;
    case ElementType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(re)); break;
    case ElementType::kInt16: static_cast<int16_t*>(buf)[i] = static_cast<int16_t>(static_cast<int64_t>(re)); break;
    case ElementType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(static_cast<int64_t>(re)); break;
    case ElementType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(re); break;
    case ElementType::kBool: static_cast<uint8_t*>(buf)[i] = re != 0 ? 1 : 0; break;
    case ElementType::kComplex64: static_cast<std::complex<float>*>(buf)[i] = std::complex<float>(v); break;
    case ElementType::kComplex128: static_cast<std::complex<double>*>(buf)[i] = v; break;
  }
}

// Reads element i of buf (dtype t) back as a complex double.
inline std::complex<double> load(ElementType t, const void* buf, size_t i) {
  switch (t) {
    case ElementType::kFloat32: return static_cast<const float*>(buf)[i];
    case ElementType::kFloat64: return static_cast<const double*>(buf)[i];
    case ElementType::kFloat16: {
      _Float16 h;
      std::memcpy(&h, static_cast<const char*>(buf) + 2 * i, 2);
      return static_cast<double>(static_cast<float>(h));
    }
    case ElementType::kBFloat16: {
      uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(buf)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case ElementType::kComplex64: return std::complex<double>(static_cast<const std::complex<float>*>(buf)[i]);
    case ElementType::kComplex128: return static_cast<const std::complex<double>*>(buf)[i];
    default: return 0;  // integers are exact; callers use gen() directly
  }
}

// The input value as the dtype actually holds it (fp16/bf16 round 2048 + v).
inline std::complex<double> held(ElementType t, int r, size_t i, int salt, bool big) {
  char tmp[16];
  store(t, tmp, 0, gen(t, r, i, salt, big));
  return load(t, tmp, 0);
}

inline void fill(ElementType t, void* buf, size_t count, int r, int salt, bool big) {
  for (size_t i = 0; i < count; ++i) store(t, buf, i, gen(t, r, i, salt, big));
}

// Integer reductions in int64 with wrap-around to the dtype width at the end (same result mod 2^bits).
inline int64_t fold_int(Reduction op, int64_t a, int64_t b, ElementType t) {
  switch (op) {
    case Reduction::kSum: return t == ElementType::kBool ? (a | b) : a + b;
    case Reduction::kProduct: return t == ElementType::kBool ? (a & b) : a * b;
    case Reduction::kMin: return b < a ? b : a;
    case Reduction::kMax: return a < b ? b : a;
    case Reduction::kBand: return a & b;
    case Reduction::kBor: return a | b;
    case Reduction::kBxor: return a ^ b;
  }
  return 0;
}

// Narrows an int64 to the dtype's signedness/width so min/max compare as the dtype does.
inline int64_t narrow(ElementType t, int64_t v) {
  switch (t) {
    case ElementType::kInt8: return static_cast<int8_t>(v);
    case ElementType::kUInt8: return static_cast<uint8_t>(v);
    case ElementType::kInt16: return static_cast<int16_t>(v);
    case ElementType::kInt32: return static_cast<int32_t>(v);
    default: return v;
  }
}

// Expected reduction of `count` elements over ranks 0..n-1 (in rank order), scaled, stored as dtype t.
inline void reference(ElementType t, Reduction op, int n, size_t count, int salt, bool big, double scale,
                      void* out, size_t first = 0) {
  for (size_t k = 0; k < count; ++k) {
    size_t i = first + k;
    if (is_float(t) || is_complex(t)) {
      std::complex<double> acc = held(t, 0, i, salt, big);
      for (int r = 1; r < n; ++r) {
        std::complex<double> v = held(t, r, i, salt, big);
        switch (op) {
          case Reduction::kSum: acc += v; break;
          case Reduction::kProduct: acc = is_complex(t) ? acc * v : std::complex<double>(acc.real() * v.real()); break;
          case Reduction::kMin: acc = v.real() < acc.real() ? v : acc; break;
          case Reduction::kMax: acc = acc.real() < v.real() ? v : acc; break;
          default: break;
        }
      }
      // fp32 accumulation is exact for these values except products overflowing fp16/bf16 ranges,
      // where double -> float -> half rounds the same way.
      acc *= scale;
      store(t, out, k, acc);
    } else {
      int64_t acc = narrow(t, static_cast<int64_t>(gen(t, 0, i, salt, big).real()));
      for (int r = 1; r < n; ++r) {
        int64_t v = narrow(t, static_cast<int64_t>(gen(t, r, i, salt, big).real()));
        acc = narrow(t, fold_int(op, acc, v, t));
      }
      store(t, out, k, std::complex<double>(static_cast<double>(acc), 0));
    }
  }
}

inline const std::vector<ElementType>& all_dtypes() {
  static const std::vector<ElementType> v = {
      ElementType::kFloat32, ElementType::kFloat64, ElementType::kFloat16, ElementType::kBFloat16,
      ElementType::kInt8,    ElementType::kUInt8,   ElementType::kInt16,   ElementType::kInt32,
      ElementType::kInt64,   ElementType::kBool,    ElementType::kComplex64, ElementType::kComplex128};
  return v;
}
inline const std::vector<Reduction>& all_ops() {
  static const std::vector<Reduction> v = {Reduction::kSum,  Reduction::kProduct, Reduction::kMin, Reduction::kMax,
                                          Reduction::kBand, Reduction::kBor,     Reduction::kBxor};
  return v;
}
inline bool supported(ElementType t, Reduction op) {
  bool bitwise = op == Reduction::kBand || op == Reduction::kBor || op == Reduction::kBxor;
  if (bitwise) return !is_float(t) && !is_complex(t);
  if (is_complex(t)) return op == Reduction::kSum || op == Reduction::kProduct;
  return true;
}

inline std::string hexdiff(const void* a, const void* b, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) {
    unsigned x = static_cast<const uint8_t*>(a)[i], y = static_cast<const uint8_t*>(b)[i];
    if (x != y) return "first difference at byte " + std::to_string(i) + ": got " + std::to_string(x) +
                       " expected " + std::to_string(y);
  }
  return "equal";
}

}  // namespace drv
