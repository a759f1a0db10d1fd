// Node layout of a process group: which group ranks share a node (and so a shared-memory communicator).
// Torch-free.
#pragma once
#include <string>
#include <vector>

namespace npudist::hccl {

// This process's node identity: NPUDIST_NODE_ID if set (tests simulate several nodes on one host),
// else the host name.
std::string detect_node_id();

struct Topology {
  int rank = 0;                           // group rank
  int size = 1;
  std::vector<int> node_of_rank;          // group rank -> node index (nodes numbered by first rank)
  std::vector<std::vector<int>> nodes;    // node index -> its group ranks, ascending
  int node = 0;                           // my node index
  int local_rank = 0;                     // my index within nodes[node]
  int num_nodes() const { return static_cast<int>(nodes.size()); }
  int local_size() const { return static_cast<int>(nodes[node].size()); }
  const std::vector<int>& local_ranks() const { return nodes[node]; }
  int leader(int n) const { return nodes[n].front(); }
  bool is_leader() const { return local_rank == 0; }
  int local_index_of(int group_rank) const;  // index within its own node
};

// node_ids[r] is group rank r's node identity string.
Topology build_topology(int rank, const std::vector<std::string>& node_ids);

}  // namespace npudist::hccl
