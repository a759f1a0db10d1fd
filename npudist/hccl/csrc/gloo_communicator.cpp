// GlooCommunicator. Gloo moves bytes: buffers are viewed as CPU uint8 tensors (npu memory is host memory),
// so every dtype passes; reductions all-gather the contributions and combine them here, in torch, with
// the same accumulation rules as the engine (fp16/bf16 in fp32, bool as logical ops).
//
// Construction goes through torch's Python binding of ProcessGroupGloo: its C++ constructor and
// Options::create_default are exported by libtorch_cpu, but ProcessGroupGloo.hpp includes Gloo's own
// headers (gloo/algorithm.h, gloo/context.h, ...), which the torch wheel does not ship, so an extension
// cannot declare the class. The binding is torch's supported constructor (default device from the host
// name, Gloo's default thread count); we call it directly under the GIL -- no factory registered from
// Python.
#include "gloo_communicator.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <vector>

namespace npudist::hccl {

namespace {

at::ScalarType scalar_type_of(comm::ElementType t) {
  switch (t) {
    case comm::ElementType::kFloat32: return at::kFloat;
    case comm::ElementType::kFloat64: return at::kDouble;
    case comm::ElementType::kFloat16: return at::kHalf;
    case comm::ElementType::kBFloat16: return at::kBFloat16;
    case comm::ElementType::kInt8: return at::kChar;
    case comm::ElementType::kUInt8: return at::kByte;
    case comm::ElementType::kInt16: return at::kShort;
    case comm::ElementType::kInt32: return at::kInt;
    case comm::ElementType::kInt64: return at::kLong;
    case comm::ElementType::kBool: return at::kBool;
    case comm::ElementType::kComplex64: return at::kComplexFloat;
    case comm::ElementType::kComplex128: return at::kComplexDouble;
  }
  throw comm::CommError(comm::FailureKind::kInvalidArgument, "gloo communicator: unknown dtype");
}

// A CPU tensor over caller memory (not owned). Every buffer Gloo reads or writes is viewed here.
// HOST-MEMORY: npu buffers are viewed as CPU tensors over the same bytes; a real device stages through host.
at::Tensor view_of(const void* p, size_t count, at::ScalarType t) {
  return at::from_blob(const_cast<void*>(p), {static_cast<int64_t>(count)},
                       at::TensorOptions().dtype(t).device(at::kCPU));
}

at::Tensor bytes_of(const void* p, size_t bytes) { return view_of(p, bytes, at::kByte); }

// Combines the contributions (rows of `parts`) with the reduce op, then multiplies by `scale` (AVG,
// PREMUL_SUM). fp16/bf16 accumulate and scale in fp32 and round once, as the shm engine does
// (docs/hccl_engine.md): scaling after the rounding rounded twice.
at::Tensor combine(const at::Tensor& parts, comm::Reduction op, double scale) {
  const auto t = parts.scalar_type();
  if (t == at::kBool) {
    switch (op) {
      case comm::Reduction::kSum: case comm::Reduction::kMax: case comm::Reduction::kBor: return parts.any(0);
      case comm::Reduction::kProduct: case comm::Reduction::kMin: case comm::Reduction::kBand: return parts.all(0);
      case comm::Reduction::kBxor: return parts.to(at::kByte).sum(0).remainder(2).to(at::kBool);
    }
  }
  const bool low = t == at::kHalf || t == at::kBFloat16;
  at::Tensor p = low ? parts.to(at::kFloat) : parts;
  at::Tensor r;
  switch (op) {
    case comm::Reduction::kSum: r = p.sum(0, false, p.scalar_type()); break;
    case comm::Reduction::kProduct: r = p.prod(0, false, p.scalar_type()); break;
    case comm::Reduction::kMin: r = p.amin(0); break;
    case comm::Reduction::kMax: r = p.amax(0); break;
    case comm::Reduction::kBand: case comm::Reduction::kBor: case comm::Reduction::kBxor: {
      r = p[0].clone();
      for (int64_t i = 1; i < p.size(0); ++i) {
        if (op == comm::Reduction::kBand) r.bitwise_and_(p[i]);
        else if (op == comm::Reduction::kBor) r.bitwise_or_(p[i]);
        else r.bitwise_xor_(p[i]);
      }
      break;
    }
  }
  if (scale != 1.0) r.mul_(scale);
  return low ? r.to(t) : r;
}

// Reduces `rows` contributions of `count` elements (stacked byte buffers) into `out`.
void combine_into(const std::vector<at::Tensor>& rows, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                  double scale) {
  const at::ScalarType st = scalar_type_of(t);
  const int64_t n = static_cast<int64_t>(rows.size());
  at::Tensor parts = at::stack(rows).view(st).view({n, static_cast<int64_t>(count)});
  view_of(out, count, st).copy_(combine(parts, op, scale));
}

// `n` byte views of consecutive blocks of `block` bytes starting at `p`.
std::vector<at::Tensor> blocks_of(void* p, size_t block, int n) {
  at::Tensor flat = bytes_of(p, block * n);
  std::vector<at::Tensor> v;
  const auto len = static_cast<int64_t>(block);
  for (int r = 0; r < n; ++r) v.push_back(flat.narrow(0, r * len, len));
  return v;
}

}  // namespace

std::unique_ptr<GlooCommunicator> GlooCommunicator::connect(const c10::intrusive_ptr<c10d::Store>& store,
                                                            int rank, int size,
                                                            std::chrono::milliseconds timeout) {
  c10::intrusive_ptr<c10d::Backend> gloo;
  {
    pybind11::gil_scoped_acquire gil;
    pybind11::object cls = pybind11::module_::import("torch.distributed").attr("ProcessGroupGloo");
    gloo = cls(store, rank, size, timeout).cast<c10::intrusive_ptr<c10d::Backend>>();
  }
  return std::make_unique<GlooCommunicator>(std::move(gloo), rank, size);
}

GlooCommunicator::GlooCommunicator(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size)
    : gloo_(std::move(gloo)), rank_(rank), size_(size) {}

void GlooCommunicator::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> g(reason_mu_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  aborted_ = true;
  gloo_->abort();
}

void GlooCommunicator::check_usable(const char* what) {
  if (!aborted_) return;
  std::lock_guard<std::mutex> g(reason_mu_);
  throw comm::CommError(comm::FailureKind::kAborted,
                    std::string(what) + ": the Gloo communicator was aborted: " + abort_reason_);
}

void GlooCommunicator::wait(const c10::intrusive_ptr<c10d::Work>& w, const char* what) {
  try {
    w->wait();
  } catch (const std::exception& e) {
    throw comm::CommError(comm::FailureKind::kSystem, std::string(what) + " over Gloo failed: " + e.what());
  }
}

void GlooCommunicator::all_reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                                  double scale, const comm::CollectiveInfo& info, const comm::Stream&) {
  check_usable(info.op);
  const size_t bytes = count * comm::element_bytes(t);
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int j = 0; j < size_; ++j) outs[0].push_back(at::empty({static_cast<int64_t>(bytes)}, at::kByte));
  std::vector<at::Tensor> ins{bytes_of(in, bytes)};
  wait(gloo_->allgather(outs, ins, c10d::AllgatherOptions()), info.op);
  combine_into(outs[0], out, count, t, op, scale);
}

void GlooCommunicator::broadcast(void* buf, size_t count, comm::ElementType t, int root,
                                 const comm::CollectiveInfo& info, const comm::Stream&) {
  check_usable(info.op);
  std::vector<at::Tensor> v{bytes_of(buf, count * comm::element_bytes(t))};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  wait(gloo_->broadcast(v, o), info.op);
}

void GlooCommunicator::reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                              double scale, int root, const comm::CollectiveInfo& info, const comm::Stream&) {
  check_usable(info.op);
  const size_t bytes = count * comm::element_bytes(t);
  std::vector<std::vector<at::Tensor>> outs;
  if (rank_ == root) {
    outs.emplace_back();
    for (int j = 0; j < size_; ++j) outs[0].push_back(at::empty({static_cast<int64_t>(bytes)}, at::kByte));
  }
  std::vector<at::Tensor> ins{bytes_of(in, bytes)};
  c10d::GatherOptions o;
  o.rootRank = root;
  wait(gloo_->gather(outs, ins, o), info.op);
  if (rank_ == root) combine_into(outs[0], out, count, t, op, scale);
}

void GlooCommunicator::all_gather(const void* in, void* out, size_t count, comm::ElementType t,
                                  const comm::CollectiveInfo& info, const comm::Stream&) {
  check_usable(info.op);
  const size_t bytes = count * comm::element_bytes(t);
  std::vector<std::vector<at::Tensor>> outs{blocks_of(out, bytes, size_)};
  std::vector<at::Tensor> ins{bytes_of(in, bytes)};
  wait(gloo_->allgather(outs, ins, c10d::AllgatherOptions()), info.op);
}

void GlooCommunicator::reduce_scatter(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                                      double scale, const comm::CollectiveInfo& info, const comm::Stream& s) {
  const size_t es = comm::element_bytes(t);
  std::vector<char> all(count * es * size_);
  all_reduce(in, all.data(), count * size_, t, op, scale, info, s);
  // HOST-MEMORY: copies this rank's block into `out` with the CPU; a real device copies host to device.
  std::memcpy(out, all.data() + static_cast<size_t>(rank_) * count * es, count * es);
}

void GlooCommunicator::all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets,
                                  void* out, const size_t* recv_counts, const size_t* recv_offsets,
                                  comm::ElementType t, const comm::CollectiveInfo& info, const comm::Stream&) {
  check_usable(info.op);
  // Gloo takes split sizes of packed blocks: offsets must be the running sums of the counts.
  const int64_t es = static_cast<int64_t>(comm::element_bytes(t));
  std::vector<int64_t> sb(size_), rb(size_);
  size_t stotal = 0, rtotal = 0;
  for (int j = 0; j < size_; ++j) {
    if (send_offsets[j] != stotal || recv_offsets[j] != rtotal) {
      throw comm::CommError(comm::FailureKind::kInvalidArgument,
                        std::string(info.op) + ": the Gloo communicator needs packed all_to_all blocks");
    }
    sb[j] = static_cast<int64_t>(send_counts[j]) * es;
    rb[j] = static_cast<int64_t>(recv_counts[j]) * es;
    stotal += send_counts[j];
    rtotal += recv_counts[j];
  }
  at::Tensor o = bytes_of(out, rtotal * es), i = bytes_of(in, stotal * es);
  wait(gloo_->alltoall_base(o, i, rb, sb, c10d::AllToAllOptions()), info.op);
}

void GlooCommunicator::gather(const void* in, void* out, size_t count, comm::ElementType t, int root,
                              const comm::CollectiveInfo& info, const comm::Stream&) {
  check_usable(info.op);
  const size_t bytes = count * comm::element_bytes(t);
  std::vector<std::vector<at::Tensor>> outs;
  if (rank_ == root) outs.push_back(blocks_of(out, bytes, size_));
  std::vector<at::Tensor> ins{bytes_of(in, bytes)};
  c10d::GatherOptions o;
  o.rootRank = root;
  wait(gloo_->gather(outs, ins, o), info.op);
}

void GlooCommunicator::scatter(const void* in, void* out, size_t count, comm::ElementType t, int root,
                               const comm::CollectiveInfo& info, const comm::Stream&) {
  check_usable(info.op);
  const size_t bytes = count * comm::element_bytes(t);
  std::vector<std::vector<at::Tensor>> ins;
  if (rank_ == root) ins.push_back(blocks_of(const_cast<void*>(in), bytes, size_));
  std::vector<at::Tensor> outs{bytes_of(out, bytes)};
  c10d::ScatterOptions o;
  o.rootRank = root;
  wait(gloo_->scatter(outs, ins, o), info.op);
}

void GlooCommunicator::barrier(const comm::CollectiveInfo& info, const comm::Stream&) {
  check_usable(info.op);
  wait(gloo_->barrier(c10d::BarrierOptions()), info.op);
}

void GlooCommunicator::send(const void* buf, size_t count, comm::ElementType t, int peer, int tag,
                            const comm::Stream&) {
  check_usable("send");
  std::vector<at::Tensor> v{bytes_of(buf, count * comm::element_bytes(t))};
  wait(gloo_->send(v, peer, tag), "send");
}

void GlooCommunicator::recv(void* buf, size_t count, comm::ElementType t, int peer, int tag, const comm::Stream&) {
  check_usable("recv");
  std::vector<at::Tensor> v{bytes_of(buf, count * comm::element_bytes(t))};
  wait(gloo_->recv(v, peer, tag), "recv");
}

}  // namespace npudist::hccl
