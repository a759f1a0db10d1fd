// Each op as one call on the group's Communicator: the c10d reduce op mapped to the seam's Reduction and
// post-scale, element counts and type, and the stream the op is ordered on. Which transport runs it
// (shared memory, Gloo, hierarchical) was decided once at construction (process_group_hccl.cpp).
#include <c10/util/Exception.h>

#include "process_group_hccl.h"

namespace npudist::hccl {

namespace {
struct Scaling {
  comm::Reduction op = comm::Reduction::kSum;
  double scale = 1.0;       // applied by the communicator (floating point / complex)
  bool int_average = false;  // integer AVG: sum, then divide (truncating) by the group size
};

Scaling map_reduce(const c10d::ReduceOp& op, at::ScalarType t, int size) {
  Scaling s;
  const bool fp = at::isFloatingType(t) || at::isComplexType(t);
  switch (op.op_) {
    case c10d::ReduceOp::SUM: s.op = comm::Reduction::kSum; break;
    case c10d::ReduceOp::AVG:
      s.op = comm::Reduction::kSum;
      if (fp) s.scale = 1.0 / size; else s.int_average = true;
      break;
    case c10d::ReduceOp::PRODUCT: s.op = comm::Reduction::kProduct; break;
    case c10d::ReduceOp::MIN: s.op = comm::Reduction::kMin; break;
    case c10d::ReduceOp::MAX: s.op = comm::Reduction::kMax; break;
    case c10d::ReduceOp::BAND: s.op = comm::Reduction::kBand; break;
    case c10d::ReduceOp::BOR: s.op = comm::Reduction::kBor; break;
    case c10d::ReduceOp::BXOR: s.op = comm::Reduction::kBxor; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      // sum(f * x_i) == f * sum(x_i): the factor is applied once, after the sum.
      s.op = comm::Reduction::kSum;
      auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK_VALUE(sup != nullptr, "hccl: PREMUL_SUM without a factor");
      s.scale = sup->tensor_factor.defined() ? sup->tensor_factor.item<double>() : sup->double_factor;
      break;
    }
    default: TORCH_CHECK_VALUE(false, "hccl: unsupported reduce op");
  }
  return s;
}

void finish_int_average(at::Tensor& t, const Scaling& s, int size) {
  if (s.int_average) t.div_(size, "trunc");
}

size_t count_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }
comm::ElementType type_of(const at::Tensor& t, const char* op) { return element_type_of(t.scalar_type(), op); }

}  // namespace

comm::Stream ProcessGroupHCCL::stream_of(const at::Tensor& t) {
  if (t.device().type() != c10::DeviceType::PrivateUse1) return comm::Stream{};
  const int device = t.device().index();
  return comm::Stream{device, comm_stream(device)};
}

void ProcessGroupHCCL::do_all_reduce(at::Tensor& t, const c10d::ReduceOp& op, uint64_t seq,
                                     const char* name) {
  if (t.numel() == 0) return;
  const Scaling s = map_reduce(op, t.scalar_type(), size_);
  comm_->all_reduce(t.data_ptr(), t.data_ptr(), count_of(t), type_of(t, name), s.op, s.scale,
                    comm::CollectiveInfo{name, seq}, stream_of(t));
  finish_int_average(t, s, size_);
}

void ProcessGroupHCCL::do_broadcast(at::Tensor& t, int root, uint64_t seq, const char* name) {
  if (t.numel() == 0) return;
  comm_->broadcast(t.data_ptr(), count_of(t), type_of(t, name), root, comm::CollectiveInfo{name, seq}, stream_of(t));
}

void ProcessGroupHCCL::do_reduce(at::Tensor& t, const c10d::ReduceOp& op, int root, uint64_t seq) {
  if (t.numel() == 0) return;
  const Scaling s = map_reduce(op, t.scalar_type(), size_);
  comm_->reduce(t.data_ptr(), t.data_ptr(), count_of(t), type_of(t, "reduce"), s.op, s.scale, root,
                comm::CollectiveInfo{"reduce", seq}, stream_of(t));
  if (rank_ == root) finish_int_average(t, s, size_);
}

void ProcessGroupHCCL::do_all_gather(const at::Tensor& in, at::Tensor& out, uint64_t seq,
                                     const char* name) {
  if (in.numel() == 0) return;
  comm_->all_gather(in.data_ptr(), out.data_ptr(), count_of(in), type_of(in, name), comm::CollectiveInfo{name, seq},
                    stream_of(out));
}

void ProcessGroupHCCL::do_reduce_scatter(const at::Tensor& in, at::Tensor& out, const c10d::ReduceOp& op,
                                         uint64_t seq, const char* name) {
  if (out.numel() == 0) return;
  const Scaling s = map_reduce(op, in.scalar_type(), size_);
  comm_->reduce_scatter(in.data_ptr(), out.data_ptr(), count_of(out), type_of(in, name), s.op, s.scale,
                        comm::CollectiveInfo{name, seq}, stream_of(out));
  finish_int_average(out, s, size_);
}

void ProcessGroupHCCL::do_all_to_all(const at::Tensor& in, at::Tensor& out,
                                     const std::vector<int64_t>& send_elems,
                                     const std::vector<int64_t>& recv_elems, uint64_t seq,
                                     const char* name) {
  std::vector<size_t> sc(size_), so(size_), rc(size_), ro(size_);
  size_t soff = 0, roff = 0;
  for (int j = 0; j < size_; ++j) {
    sc[j] = static_cast<size_t>(send_elems[j]);
    rc[j] = static_cast<size_t>(recv_elems[j]);
    so[j] = soff;
    ro[j] = roff;
    soff += sc[j];
    roff += rc[j];
  }
  comm_->all_to_all(in.data_ptr(), sc.data(), so.data(), out.data_ptr(), rc.data(), ro.data(),
                    type_of(in, name), comm::CollectiveInfo{name, seq}, stream_of(out));
}

void ProcessGroupHCCL::do_gather(const at::Tensor& in, at::Tensor* out, int root, uint64_t seq) {
  if (in.numel() == 0) return;
  comm_->gather(in.data_ptr(), out ? out->data_ptr() : nullptr, count_of(in), type_of(in, "gather"), root,
                comm::CollectiveInfo{"gather", seq}, stream_of(in));
}

void ProcessGroupHCCL::do_scatter(const at::Tensor* in, at::Tensor& out, int root, uint64_t seq) {
  if (out.numel() == 0) return;
  comm_->scatter(in ? in->data_ptr() : nullptr, out.data_ptr(), count_of(out), type_of(out, "scatter"), root,
                 comm::CollectiveInfo{"scatter", seq}, stream_of(out));
}

void ProcessGroupHCCL::do_barrier(uint64_t seq) {
  comm_->barrier(comm::CollectiveInfo{"barrier", seq}, comm::Stream{});
}

void ProcessGroupHCCL::do_send(const at::Tensor& t, int peer, int tag) {
  comm_->send(t.data_ptr(), count_of(t), type_of(t, "send"), peer, tag, stream_of(t));
}

void ProcessGroupHCCL::do_recv(at::Tensor& t, int peer, int tag) {
  comm_->recv(t.data_ptr(), count_of(t), type_of(t, "recv"), peer, tag, stream_of(t));
}

}  // namespace npudist::hccl
