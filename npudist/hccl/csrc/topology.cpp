#include "topology.h"

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <stdexcept>

namespace npudist::hccl {

std::string detect_node_id() {
  if (const char* env = std::getenv("NPUDIST_NODE_ID"); env && *env) return env;
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

int Topology::local_index_of(int group_rank) const {
  const auto& members = nodes[node_of_rank.at(group_rank)];
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == group_rank) return static_cast<int>(i);
  }
  throw std::logic_error("rank missing from its own node");
}

Topology build_topology(int rank, const std::vector<std::string>& node_ids) {
  Topology t;
  t.rank = rank;
  t.size = static_cast<int>(node_ids.size());
  t.node_of_rank.resize(node_ids.size());
  std::map<std::string, int> index;
  for (size_t r = 0; r < node_ids.size(); ++r) {
    auto it = index.find(node_ids[r]);
    if (it == index.end()) {
      it = index.emplace(node_ids[r], static_cast<int>(t.nodes.size())).first;
      t.nodes.emplace_back();
    }
    t.node_of_rank[r] = it->second;
    t.nodes[it->second].push_back(static_cast<int>(r));
  }
  t.node = t.node_of_rank.at(rank);
  t.local_rank = t.local_index_of(rank);
  return t;
}

}  // namespace npudist::hccl
