// The collective vocabulary below the communicator seam and the shared-memory engine: element types,
// reductions, failures and the per-collective description. Both speak it (communicator.h, the engine's
// engine.h), so the engine implements the seam without translation. Plain C++17, standard headers only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace npudist::comm {

enum class ElementType : uint8_t {
  kFloat32, kFloat64, kFloat16, kBFloat16, kInt8, kUInt8, kInt16, kInt32, kInt64, kBool,
  kComplex64, kComplex128,
};

// Bytes per element; 0 for a value outside the enumeration (a corrupted descriptor).
inline size_t element_bytes(ElementType t) {
  switch (t) {
    case ElementType::kFloat64: case ElementType::kInt64: case ElementType::kComplex64: return 8;
    case ElementType::kComplex128: return 16;
    case ElementType::kFloat32: case ElementType::kInt32: return 4;
    case ElementType::kFloat16: case ElementType::kBFloat16: case ElementType::kInt16: return 2;
    case ElementType::kInt8: case ElementType::kUInt8: case ElementType::kBool: return 1;
  }
  return 0;
}

// How contributions combine; AVG and PREMUL_SUM are kSum plus a post-scale (see above).
enum class Reduction : uint8_t { kSum, kProduct, kMin, kMax, kBand, kBor, kBxor };

// What went wrong, so the process group can raise the right torch error type.
enum class FailureKind { kTimeout, kPeerDied, kMismatch, kAborted, kInvalidArgument, kSystem };

struct CommError : std::runtime_error {
  CommError(FailureKind k, const std::string& msg, std::vector<int> who = {})
      : std::runtime_error(msg), kind(k), ranks(std::move(who)) {}
  FailureKind kind;
  // Ranks the error is about (did not arrive / died / disagree), in global numbering where known. May be empty.
  std::vector<int> ranks;
};

// Per-collective description: every rank's must agree (implementations may check and report kMismatch).
struct CollectiveInfo {
  const char* op = "";   // "all_reduce", "broadcast", ...
  uint64_t seq = 0;      // the group's collective sequence number, reported in errors
};

inline const char* element_type_name(ElementType t) {
  switch (t) {
    case ElementType::kFloat32: return "float32";
    case ElementType::kFloat64: return "float64";
    case ElementType::kFloat16: return "float16";
    case ElementType::kBFloat16: return "bfloat16";
    case ElementType::kInt8: return "int8";
    case ElementType::kUInt8: return "uint8";
    case ElementType::kInt16: return "int16";
    case ElementType::kInt32: return "int32";
    case ElementType::kInt64: return "int64";
    case ElementType::kBool: return "bool";
    case ElementType::kComplex64: return "complex64";
    case ElementType::kComplex128: return "complex128";
  }
  return "unknown";
}

inline const char* reduction_name(Reduction op) {
  switch (op) {
    case Reduction::kSum: return "sum";
    case Reduction::kProduct: return "product";
    case Reduction::kMin: return "min";
    case Reduction::kMax: return "max";
    case Reduction::kBand: return "band";
    case Reduction::kBor: return "bor";
    case Reduction::kBxor: return "bxor";
  }
  return "unknown";
}

}  // namespace npudist::comm
