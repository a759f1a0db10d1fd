// Helpers shared by the op translation units (collectives, exchange, point_to_point, barriers,
// sparse_all_reduce): argument checks that
// raise ValueError, contiguous staging and list flattening, and the OpSpec boilerplate.
#pragma once
#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "process_group_hccl.h"

namespace npudist::hccl::ops {

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK_VALUE(a.device() == b.device(), "hccl ", op, ": all tensors of one call must be on one device, got ",
                    a.device(), " and ", b.device(), "; move them with .to(device)");
}


inline const char* reduce_name(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// Rejects reduce ops the dtype cannot take (PyTorch semantics), before anything is issued.
inline void check_reduce(const c10d::ReduceOp& op, at::ScalarType t, const char* name) {
  const bool fp = at::isFloatingType(t), cplx = at::isComplexType(t), boolean = t == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK_VALUE(!fp && !cplx, "hccl ", name, ": ReduceOp.", reduce_name(op),
                        " needs an integer or bool tensor, got ", t,
                        "; use SUM/MIN/MAX for floating point");
      break;
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      TORCH_CHECK_VALUE(!cplx, "hccl ", name, ": ReduceOp.", reduce_name(op),
                        " is undefined for complex tensors");
      break;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK_VALUE(!boolean, "hccl ", name, ": ReduceOp.AVG is undefined for bool tensors");
      break;
    case c10d::ReduceOp::PREMUL_SUM:
      TORCH_CHECK_VALUE(fp || cplx, "hccl ", name,
                        ": ReduceOp.PREMUL_SUM needs a floating point tensor, got ", t);
      TORCH_CHECK_VALUE(op.supplement_, "hccl ", name, ": PREMUL_SUM without a factor");
      break;
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::PRODUCT:
      break;
    default:
      TORCH_CHECK_VALUE(false, "hccl ", name, ": unsupported reduce op ", static_cast<int>(op.op_));
  }
}

inline at::Tensor contiguous_of(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

inline void copy_back(at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_same(src)) dst.copy_(src);
}

// Flattens a list of same-dtype tensors into one contiguous buffer (for list-form collectives).
inline at::Tensor flatten(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

inline void unflatten_into(const at::Tensor& flat, std::vector<at::Tensor>& outs) {
  int64_t off = 0;
  for (auto& o : outs) {
    const int64_t n = o.numel();
    o.copy_(flat.narrow(0, off, n).view(o.sizes()));
    off += n;
  }
}


#define HCCL_SPEC(var, optype, opname, ins, outs, is_async) \
  OpSpec var;                                                \
  var.type = optype;                                         \
  var.name = opname;                                         \
  var.inputs = ins;                                          \
  var.outputs = outs;                                        \
  var.async = is_async

inline void check_one(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK_VALUE(ts.size() == 1, "hccl ", op, ": expected one tensor per process, got ", ts.size(),
                    " (multi-tensor-per-process collectives are not supported)");
}

}  // namespace npudist::hccl::ops
