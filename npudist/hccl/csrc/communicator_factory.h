// make_communicator: the one place that picks a process group's Communicator implementation (the seam:
// include/npudist/communicator.h) and connects it over the group's store.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "npudist/communicator.h"
#include "topology.h"

namespace npudist::hccl {

struct CommunicatorSetup {
  c10::intrusive_ptr<c10d::Store> store;
  std::string key_prefix;         // this construction's keys on `store`
  std::string name;               // unique per job and group (shared-memory segment names)
  std::string group_name;         // for error messages
  Topology topology;              // of the group's ranks
  std::vector<int> global_ranks;  // global rank of each group rank (error messages)
  size_t buffer_bytes = 0;        // per-rank staging buffer of the shared-memory engine
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds connect_timeout{0};
};

// A communicator whose peers did not all connect within the connect timeout (HCCL_CONNECT_TIMEOUT). `ranks`:
// the global ranks that did not arrive, when the communicator knows them.
struct ConnectTimeout : std::runtime_error {
  ConnectTimeout(const std::string& what, std::vector<int> who) : std::runtime_error(what), ranks(std::move(who)) {}
  std::vector<int> ranks;
};

// The shared-memory engine's per-rank staging buffer, the most HCCL_BUFFSIZE / hccl_buffer_size may give it.
size_t default_buffer_bytes();

// NPUDIST_HCCL_COMMUNICATOR: "auto" (default: by topology) or "gloo" (the whole group over Gloo). A bad
// value is a ValueError; call before any rank waits on this one.
bool gloo_communicator_forced();

// Gloo alone when forced; else shared memory when the group lives on one node, else hierarchical (shared
// memory inside each node, Gloo among all ranks and among node leaders). A failure to connect is a
// DistBackendError naming the group and the rank; ConnectTimeout when peers of the shared-memory
// communicator did not arrive in time.
std::unique_ptr<comm::Communicator> make_communicator(const CommunicatorSetup& setup, bool gloo_only);

}  // namespace npudist::hccl
