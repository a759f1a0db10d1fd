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

  NPUDIST_COMMUNICATOR_OPERATIONS
  void abort(const std::string& reason) override;
  uint64_t zero_copy_ops() const override { return intra_->zero_copy_ops(); }

 private:
  Topology topo_;
  std::unique_ptr<comm::Communicator> intra_, all_, leaders_;
};

}  // namespace npudist::hccl
