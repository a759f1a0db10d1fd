// HierarchicalCommunicator: a group spanning several nodes, composed from an intra-node communicator
// (shared memory) and inter-node ones (Gloo). Torch-free: it only combines other Communicators.
//   all_reduce      reduce inside the node onto its leader, leaders all_reduce, broadcast inside the node
//   reduce, reduce_scatter   all_reduce, then keep the root's / this rank's part
//   broadcast       inside the root's node, between leaders, then inside the other nodes
//   all_gather      gather onto the node leader, leaders all_gather the node blocks, broadcast in the node
//   barrier         inside the node, between leaders, inside the node again
//   all_to_all, gather, scatter, and p2p between nodes: straight over the all-ranks communicator
#pragma once
#include <memory>

#include "npudist/communicator.h"
#include "topology.h"

namespace npudist::hccl {

class HierarchicalCommunicator final : public comm::Communicator {
 public:
  // intra: this node's ranks (numbered by local index); all: every rank of the group; leaders: one rank
  // per node (numbered by node index), present on node leaders only.
  HierarchicalCommunicator(Topology topo, std::unique_ptr<comm::Communicator> intra,
                           std::unique_ptr<comm::Communicator> all, std::unique_ptr<comm::Communicator> leaders);

  const char* kind() const override { return "hierarchical"; }
  int rank() const override { return topo_.rank; }
  int size() const override { return topo_.size; }

  void all_reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op, double scale,
                  const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void broadcast(void* buf, size_t count, comm::ElementType t, int root, const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op, double scale, int root,
              const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void all_gather(const void* in, void* out, size_t count, comm::ElementType t, const comm::CollectiveInfo& info,
                  const comm::Stream& s) override;
  void reduce_scatter(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op, double scale,
                      const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets, void* out,
                  const size_t* recv_counts, const size_t* recv_offsets, comm::ElementType t, const comm::CollectiveInfo& info,
                  const comm::Stream& s) override;
  void gather(const void* in, void* out, size_t count, comm::ElementType t, int root, const comm::CollectiveInfo& info,
              const comm::Stream& s) override;
  void scatter(const void* in, void* out, size_t count, comm::ElementType t, int root, const comm::CollectiveInfo& info,
               const comm::Stream& s) override;
  void barrier(const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void send(const void* buf, size_t count, comm::ElementType t, int peer, int tag, const comm::Stream& s) override;
  void recv(void* buf, size_t count, comm::ElementType t, int peer, int tag, const comm::Stream& s) override;
  void abort(const std::string& reason) override;
  uint64_t zero_copy_ops() const override { return intra_->zero_copy_ops(); }

 private:
  Topology topo_;
  std::unique_ptr<comm::Communicator> intra_, all_, leaders_;
};

}  // namespace npudist::hccl
