// Routing of each op to the transport: one node -> the shared-memory engine; several nodes ->
// hierarchical (reduce/gather inside the node over shm, node leaders exchange over Gloo, broadcast back
// over shm); all_to_all, gather, scatter and p2p between nodes go straight over a Gloo group of all ranks.
// Gloo calls use byte views of the (host-resident) buffers, so every dtype and npu tensors pass through.
#include <c10/util/Exception.h>

#include "process_group_hccl.h"

namespace npudist::hccl {

namespace {

struct Scaling {
  ReduceOp op = ReduceOp::kSum;
  double scale = 1.0;       // applied by the engine (floating point / complex)
  bool int_average = false;  // integer AVG: sum, then divide (truncating) by the group size
};

Scaling map_reduce(const c10d::ReduceOp& op, at::ScalarType t, int size) {
  Scaling s;
  const bool fp = at::isFloatingType(t) || at::isComplexType(t);
  switch (op.op_) {
    case c10d::ReduceOp::SUM: s.op = ReduceOp::kSum; break;
    case c10d::ReduceOp::AVG:
      s.op = ReduceOp::kSum;
      if (fp) s.scale = 1.0 / size; else s.int_average = true;
      break;
    case c10d::ReduceOp::PRODUCT: s.op = ReduceOp::kProduct; break;
    case c10d::ReduceOp::MIN: s.op = ReduceOp::kMin; break;
    case c10d::ReduceOp::MAX: s.op = ReduceOp::kMax; break;
    case c10d::ReduceOp::BAND: s.op = ReduceOp::kBand; break;
    case c10d::ReduceOp::BOR: s.op = ReduceOp::kBor; break;
    case c10d::ReduceOp::BXOR: s.op = ReduceOp::kBxor; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      // sum(f * x_i) == f * sum(x_i): the factor is applied once, after the sum.
      s.op = ReduceOp::kSum;
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

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// A CPU uint8 view of a contiguous tensor's bytes (npu memory is host memory), for Gloo.
at::Tensor byte_view(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), {static_cast<int64_t>(nbytes(t))},
                       at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

// Combines the node partials gathered on a leader (rows of `parts`) with the reduce op, in torch.
at::Tensor combine(const at::Tensor& parts, ReduceOp op) {
  const auto t = parts.scalar_type();
  if (t == at::kBool) {
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kMax: case ReduceOp::kBor: return parts.any(0);
      case ReduceOp::kProduct: case ReduceOp::kMin: case ReduceOp::kBand: return parts.all(0);
      case ReduceOp::kBxor: return parts.to(at::kByte).sum(0).remainder(2).to(at::kBool);
    }
  }
  const bool low = t == at::kHalf || t == at::kBFloat16;
  at::Tensor p = low ? parts.to(at::kFloat) : parts;
  at::Tensor r;
  switch (op) {
    case ReduceOp::kSum: r = p.sum(0, false, p.scalar_type()); break;
    case ReduceOp::kProduct: r = p.prod(0, false, p.scalar_type()); break;
    case ReduceOp::kMin: r = p.amin(0); break;
    case ReduceOp::kMax: r = p.amax(0); break;
    case ReduceOp::kBand: case ReduceOp::kBor: case ReduceOp::kBxor: {
      r = p[0].clone();
      for (int64_t i = 1; i < p.size(0); ++i) {
        if (op == ReduceOp::kBand) r.bitwise_and_(p[i]);
        else if (op == ReduceOp::kBor) r.bitwise_or_(p[i]);
        else r.bitwise_xor_(p[i]);
      }
      break;
    }
  }
  return low ? r.to(t) : r;
}

}  // namespace

void ProcessGroupHCCL::gloo_wait(const c10::intrusive_ptr<c10d::Work>& w, const char* what) {
  try {
    w->wait();
  } catch (const std::exception& e) {
    throw EngineError(ErrorKind::kSystem, std::string("inter-node ") + what + " over Gloo failed: " + e.what());
  }
}

// ---------------------------------------------------------------------------------------------

void ProcessGroupHCCL::do_all_reduce(at::Tensor& t, const c10d::ReduceOp& op, uint64_t seq,
                                     const char* name) {
  if (t.numel() == 0) return;
  if (topo_.num_nodes() > 1) return hier_all_reduce(t, op, seq, name);
  const Scaling s = map_reduce(op, t.scalar_type(), size_);
  comm_->all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), to_engine_dtype(t.scalar_type(), name), s.op,
                    OpInfo{name, seq}, s.scale);
  finish_int_average(t, s, size_);
}

void ProcessGroupHCCL::do_broadcast(at::Tensor& t, int root, uint64_t seq, const char* name) {
  if (t.numel() == 0) return;
  if (topo_.num_nodes() > 1) return hier_broadcast(t, root, seq, name);
  comm_->broadcast(t.data_ptr(), nbytes(t), root, OpInfo{name, seq});
}

void ProcessGroupHCCL::do_reduce(at::Tensor& t, const c10d::ReduceOp& op, int root, uint64_t seq) {
  if (t.numel() == 0) return;
  if (topo_.num_nodes() > 1) {
    at::Tensor tmp = t.clone();
    hier_all_reduce(tmp, op, seq, "reduce");
    if (rank_ == root) t.copy_(tmp);
    return;
  }
  const Scaling s = map_reduce(op, t.scalar_type(), size_);
  comm_->reduce(t.data_ptr(), t.data_ptr(), t.numel(), to_engine_dtype(t.scalar_type(), "reduce"), s.op,
                root, OpInfo{"reduce", seq}, s.scale);
  if (rank_ == root) finish_int_average(t, s, size_);
}

void ProcessGroupHCCL::do_all_gather(const at::Tensor& in, at::Tensor& out, uint64_t seq,
                                     const char* name) {
  if (in.numel() == 0) return;
  if (topo_.num_nodes() > 1) return hier_all_gather(in, out, seq, name);
  comm_->all_gather(in.data_ptr(), out.data_ptr(), nbytes(in), OpInfo{name, seq});
}

void ProcessGroupHCCL::do_reduce_scatter(const at::Tensor& in, at::Tensor& out, const c10d::ReduceOp& op,
                                         uint64_t seq, const char* name) {
  if (out.numel() == 0) return;
  if (topo_.num_nodes() > 1) {
    at::Tensor tmp = in.clone();
    hier_all_reduce(tmp, op, seq, name);
    out.copy_(tmp.reshape({-1}).narrow(0, rank_ * out.numel(), out.numel()).view(out.sizes()));
    return;
  }
  const Scaling s = map_reduce(op, in.scalar_type(), size_);
  comm_->reduce_scatter(in.data_ptr(), out.data_ptr(), out.numel(), to_engine_dtype(in.scalar_type(), name),
                        s.op, OpInfo{name, seq}, s.scale);
  finish_int_average(out, s, size_);
}

void ProcessGroupHCCL::do_all_to_all(const at::Tensor& in, at::Tensor& out,
                                     const std::vector<int64_t>& send_elems,
                                     const std::vector<int64_t>& recv_elems, uint64_t seq,
                                     const char* name) {
  const size_t es = in.element_size();
  if (topo_.num_nodes() > 1) {
    std::vector<int64_t> sb, rb;
    for (auto v : send_elems) sb.push_back(v * static_cast<int64_t>(es));
    for (auto v : recv_elems) rb.push_back(v * static_cast<int64_t>(es));
    at::Tensor o = byte_view(out), i = byte_view(in);
    gloo_wait(gloo_all_->alltoall_base(o, i, rb, sb, c10d::AllToAllOptions()), name);
    return;
  }
  std::vector<size_t> sc(size_), so(size_), rc(size_), ro(size_);
  size_t soff = 0, roff = 0;
  for (int j = 0; j < size_; ++j) {
    sc[j] = static_cast<size_t>(send_elems[j]) * es;
    rc[j] = static_cast<size_t>(recv_elems[j]) * es;
    so[j] = soff;
    ro[j] = roff;
    soff += sc[j];
    roff += rc[j];
  }
  comm_->all_to_all(in.data_ptr(), sc.data(), so.data(), out.data_ptr(), rc.data(), ro.data(),
                    OpInfo{name, seq});
}

void ProcessGroupHCCL::do_gather(const at::Tensor& in, at::Tensor* out, int root, uint64_t seq) {
  if (in.numel() == 0) return;
  if (topo_.num_nodes() > 1) {
    std::vector<std::vector<at::Tensor>> outs(1);
    if (out) {
      at::Tensor flat = byte_view(*out);
      for (int r = 0; r < size_; ++r) outs[0].push_back(flat.narrow(0, r * nbytes(in), nbytes(in)));
    } else {
      outs.clear();
    }
    std::vector<at::Tensor> ins{byte_view(in)};
    c10d::GatherOptions o;
    o.rootRank = root;
    gloo_wait(gloo_all_->gather(outs, ins, o), "gather");
    return;
  }
  comm_->gather(in.data_ptr(), out ? out->data_ptr() : nullptr, nbytes(in), root, OpInfo{"gather", seq});
}

void ProcessGroupHCCL::do_scatter(const at::Tensor* in, at::Tensor& out, int root, uint64_t seq) {
  if (out.numel() == 0) return;
  if (topo_.num_nodes() > 1) {
    std::vector<std::vector<at::Tensor>> ins(1);
    if (in) {
      at::Tensor flat = byte_view(*in);
      for (int r = 0; r < size_; ++r) ins[0].push_back(flat.narrow(0, r * nbytes(out), nbytes(out)));
    } else {
      ins.clear();
    }
    std::vector<at::Tensor> outs{byte_view(out)};
    c10d::ScatterOptions o;
    o.rootRank = root;
    gloo_wait(gloo_all_->scatter(outs, ins, o), "scatter");
    return;
  }
  comm_->scatter(in ? in->data_ptr() : nullptr, out.data_ptr(), nbytes(out), root, OpInfo{"scatter", seq});
}

void ProcessGroupHCCL::do_barrier(uint64_t seq) {
  if (topo_.num_nodes() > 1) return hier_barrier(seq);
  comm_->barrier(OpInfo{"barrier", seq});
}

void ProcessGroupHCCL::do_send(const at::Tensor& t, int peer, int tag) {
  if (topo_.node_of_rank[peer] != topo_.node) {
    std::vector<at::Tensor> v{byte_view(t)};
    gloo_wait(gloo_all_->send(v, peer, tag), "send");
    return;
  }
  comm_->send(t.data_ptr(), nbytes(t), topo_.local_index_of(peer), tag);
}

void ProcessGroupHCCL::do_recv(at::Tensor& t, int peer, int tag) {
  if (topo_.node_of_rank[peer] != topo_.node) {
    std::vector<at::Tensor> v{byte_view(t)};
    gloo_wait(gloo_all_->recv(v, peer, tag), "recv");
    return;
  }
  comm_->recv(t.data_ptr(), nbytes(t), topo_.local_index_of(peer), tag);
}

// ---------------------------------------------------------------------------------------------
// Hierarchical collectives (several nodes)

void ProcessGroupHCCL::hier_all_reduce(at::Tensor& t, const c10d::ReduceOp& op, uint64_t seq,
                                       const char* name) {
  const Scaling s = map_reduce(op, t.scalar_type(), size_);
  const DataType dt = to_engine_dtype(t.scalar_type(), name);
  // 1. Reduce inside the node onto the leader (unscaled).
  comm_->reduce(t.data_ptr(), t.data_ptr(), t.numel(), dt, s.op, 0, OpInfo{name, seq}, 1.0);
  // 2. Leaders exchange node partials and combine them.
  if (topo_.is_leader()) {
    const int nn = topo_.num_nodes();
    at::Tensor mine = byte_view(t);
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int j = 0; j < nn; ++j) outs[0].push_back(at::empty_like(mine));
    std::vector<at::Tensor> ins{mine};
    gloo_wait(gloo_leaders_->allgather(outs, ins, c10d::AllgatherOptions()), name);
    at::Tensor parts = at::stack(outs[0]).view(t.scalar_type()).view({nn, t.numel()});
    at::Tensor r = combine(parts, s.op);
    if (s.scale != 1.0) r.mul_(s.scale);
    at::from_blob(t.data_ptr(), {t.numel()}, at::TensorOptions().dtype(t.scalar_type())).copy_(r);
  }
  // 3. Broadcast the result inside the node.
  comm_->broadcast(t.data_ptr(), nbytes(t), 0, OpInfo{name, seq});
  finish_int_average(t, s, size_);
}

void ProcessGroupHCCL::hier_broadcast(at::Tensor& t, int root, uint64_t seq, const char* name) {
  const int root_node = topo_.node_of_rank[root];
  if (topo_.node == root_node) {
    comm_->broadcast(t.data_ptr(), nbytes(t), topo_.local_index_of(root), OpInfo{name, seq});
  }
  if (topo_.is_leader()) {
    std::vector<at::Tensor> v{byte_view(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root_node;
    gloo_wait(gloo_leaders_->broadcast(v, o), name);
  }
  if (topo_.node != root_node) comm_->broadcast(t.data_ptr(), nbytes(t), 0, OpInfo{name, seq});
}

void ProcessGroupHCCL::hier_all_gather(const at::Tensor& in, at::Tensor& out, uint64_t seq,
                                       const char* name) {
  const size_t n = nbytes(in);
  const int ls = topo_.local_size();
  int max_local = 0;
  for (const auto& members : topo_.nodes) max_local = std::max<int>(max_local, members.size());
  // 1. Gather the node's blocks on the leader (local-rank order, padded to the largest node).
  at::Tensor node_buf;
  if (topo_.is_leader()) node_buf = at::empty({static_cast<int64_t>(n) * max_local}, at::kByte);
  comm_->gather(in.data_ptr(), topo_.is_leader() ? node_buf.data_ptr() : nullptr, n, 0, OpInfo{name, seq});
  (void)ls;
  // 2. Leaders exchange node buffers and place each block at its group rank.
  if (topo_.is_leader()) {
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int j = 0; j < topo_.num_nodes(); ++j) outs[0].push_back(at::empty_like(node_buf));
    std::vector<at::Tensor> ins{node_buf};
    gloo_wait(gloo_leaders_->allgather(outs, ins, c10d::AllgatherOptions()), name);
    at::Tensor dst = byte_view(out);
    for (int j = 0; j < topo_.num_nodes(); ++j) {
      for (size_t i = 0; i < topo_.nodes[j].size(); ++i) {
        const int r = topo_.nodes[j][i];
        dst.narrow(0, r * n, n).copy_(outs[0][j].narrow(0, i * n, n));
      }
    }
  }
  // 3. Broadcast the full result inside the node.
  comm_->broadcast(out.data_ptr(), n * size_, 0, OpInfo{name, seq});
}

void ProcessGroupHCCL::hier_barrier(uint64_t seq) {
  comm_->barrier(OpInfo{"barrier", seq});
  if (topo_.is_leader()) gloo_wait(gloo_leaders_->barrier(c10d::BarrierOptions()), "barrier");
  comm_->barrier(OpInfo{"barrier", seq});
}

}  // namespace npudist::hccl
