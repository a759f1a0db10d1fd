#include "hierarchical_communicator.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace npudist::hccl {

namespace {
std::unique_ptr<char[]> scratch(size_t bytes) { return std::unique_ptr<char[]>(new char[bytes]); }
}  // namespace

HierarchicalCommunicator::HierarchicalCommunicator(Topology topo, std::unique_ptr<comm::Communicator> intra,
                                                   std::unique_ptr<comm::Communicator> all,
                                                   std::unique_ptr<comm::Communicator> leaders)
    : topo_(std::move(topo)), intra_(std::move(intra)), all_(std::move(all)), leaders_(std::move(leaders)) {
  assert(intra_ && all_ && (leaders_ != nullptr) == topo_.is_leader());
}

void HierarchicalCommunicator::all_reduce(const void* in, void* out, size_t count, comm::ElementType t,
                                          comm::Reduction op, double scale, const comm::CollectiveInfo& info,
                                          const comm::Stream& s) {
  // Node partials are unscaled; the leaders' exchange applies the scale once.
  intra_->reduce(in, out, count, t, op, 1.0, 0, info, s);
  if (leaders_) leaders_->all_reduce(out, out, count, t, op, scale, info, s);
  intra_->broadcast(out, count, t, 0, info, s);
}

void HierarchicalCommunicator::broadcast(void* buf, size_t count, comm::ElementType t, int root,
                                         const comm::CollectiveInfo& info, const comm::Stream& s) {
  const int root_node = topo_.node_of_rank[root];
  if (topo_.node == root_node) intra_->broadcast(buf, count, t, topo_.local_index_of(root), info, s);
  if (leaders_) leaders_->broadcast(buf, count, t, root_node, info, s);
  if (topo_.node != root_node) intra_->broadcast(buf, count, t, 0, info, s);
}

void HierarchicalCommunicator::reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                                      double scale, int root, const comm::CollectiveInfo& info, const comm::Stream& s) {
  const size_t bytes = count * comm::element_bytes(t);
  auto tmp = scratch(bytes);
  // HOST-MEMORY: `in` and `out` (npu memory included) are copied with the CPU; a real device copies D2H/H2D.
  std::memcpy(tmp.get(), in, bytes);
  all_reduce(tmp.get(), tmp.get(), count, t, op, scale, info, s);
  if (topo_.rank == root) std::memcpy(out, tmp.get(), bytes);
}

void HierarchicalCommunicator::all_gather(const void* in, void* out, size_t count, comm::ElementType t,
                                          const comm::CollectiveInfo& info, const comm::Stream& s) {
  const size_t n = count * comm::element_bytes(t);
  int max_local = 0;
  for (const auto& members : topo_.nodes) max_local = std::max<int>(max_local, members.size());
  // Node blocks in local-rank order, padded to the largest node so the leaders' exchange is even.
  const size_t node_bytes = n * max_local;
  std::unique_ptr<char[]> node_buf;
  if (leaders_) node_buf = scratch(node_bytes);
  intra_->gather(in, node_buf.get(), n, comm::ElementType::kUInt8, 0, info, s);
  if (leaders_) {
    const int nn = topo_.num_nodes();
    auto all = scratch(node_bytes * nn);
    leaders_->all_gather(node_buf.get(), all.get(), node_bytes, comm::ElementType::kUInt8, info, s);
    char* dst = static_cast<char*>(out);
    // HOST-MEMORY: node blocks are written into `out` with the CPU; a real device copies host to device.
    for (int j = 0; j < nn; ++j) {
      for (size_t i = 0; i < topo_.nodes[j].size(); ++i) {
        std::memcpy(dst + topo_.nodes[j][i] * n, all.get() + j * node_bytes + i * n, n);
      }
    }
  }
  intra_->broadcast(out, n * topo_.size, comm::ElementType::kUInt8, 0, info, s);
}

void HierarchicalCommunicator::reduce_scatter(const void* in, void* out, size_t count, comm::ElementType t,
                                              comm::Reduction op, double scale, const comm::CollectiveInfo& info,
                                              const comm::Stream& s) {
  const size_t bytes = count * comm::element_bytes(t);
  auto tmp = scratch(bytes * topo_.size);
  // HOST-MEMORY: `in` and `out` (npu memory included) are copied with the CPU; a real device copies D2H/H2D.
  std::memcpy(tmp.get(), in, bytes * topo_.size);
  all_reduce(tmp.get(), tmp.get(), count * topo_.size, t, op, scale, info, s);
  std::memcpy(out, tmp.get() + topo_.rank * bytes, bytes);
}

void HierarchicalCommunicator::all_to_all(const void* in, const size_t* send_counts,
                                          const size_t* send_offsets, void* out,
                                          const size_t* recv_counts, const size_t* recv_offsets,
                                          comm::ElementType t, const comm::CollectiveInfo& info,
                                          const comm::Stream& s) {
  all_->all_to_all(in, send_counts, send_offsets, out, recv_counts, recv_offsets, t, info, s);
}

void HierarchicalCommunicator::gather(const void* in, void* out, size_t count, comm::ElementType t, int root,
                                      const comm::CollectiveInfo& info, const comm::Stream& s) {
  all_->gather(in, out, count, t, root, info, s);
}

void HierarchicalCommunicator::scatter(const void* in, void* out, size_t count, comm::ElementType t, int root,
                                       const comm::CollectiveInfo& info, const comm::Stream& s) {
  all_->scatter(in, out, count, t, root, info, s);
}

void HierarchicalCommunicator::barrier(const comm::CollectiveInfo& info, const comm::Stream& s) {
  intra_->barrier(info, s);
  if (leaders_) leaders_->barrier(info, s);
  intra_->barrier(info, s);
}

void HierarchicalCommunicator::send(const void* buf, size_t count, comm::ElementType t, int peer, int tag,
                                    const comm::Stream& s) {
  if (topo_.node_of_rank[peer] == topo_.node) {
    return intra_->send(buf, count, t, topo_.local_index_of(peer), tag, s);
  }
  all_->send(buf, count, t, peer, tag, s);
}

void HierarchicalCommunicator::recv(void* buf, size_t count, comm::ElementType t, int peer, int tag,
                                    const comm::Stream& s) {
  if (topo_.node_of_rank[peer] == topo_.node) {
    return intra_->recv(buf, count, t, topo_.local_index_of(peer), tag, s);
  }
  all_->recv(buf, count, t, peer, tag, s);
}

void HierarchicalCommunicator::abort(const std::string& reason) {
  intra_->abort(reason);
  all_->abort(reason);
  if (leaders_) leaders_->abort(reason);
}

}  // namespace npudist::hccl
