#include "communicator_factory.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>

#include "engine.h"
#include "gloo_communicator.h"
#include "hierarchical_communicator.h"
#include "internal.h"
#include "shm_communicator.h"

namespace npudist::hccl {

namespace {

// The engine's connect-time exchange over the group's store (keys under a per-node prefix).
struct StoreBootstrap : shm::Bootstrap {
  StoreBootstrap(c10::intrusive_ptr<c10d::Store> s, std::string p, std::chrono::milliseconds t)
      : store(std::move(s)), prefix(std::move(p)), timeout(t) {}
  void set(const std::string& key, const std::string& value) override {
    store->set(prefix + key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key) override {
    store->wait({prefix + key}, timeout);
    const auto bytes = store->get(prefix + key);
    return {bytes.begin(), bytes.end()};
  }
  c10::intrusive_ptr<c10d::Store> store;
  std::string prefix;
  std::chrono::milliseconds timeout;
};

// The node's shared-memory communicator over the group's ranks on the node.
std::unique_ptr<comm::Communicator> connect_shm(const CommunicatorSetup& s) {
  const Topology& topo = s.topology;
  shm::CommConfig cfg;
  cfg.name = s.name;
  cfg.rank = topo.local_rank;
  cfg.size = topo.local_size();
  cfg.buffer_bytes = s.buffer_bytes;
  cfg.timeout = s.timeout;
  for (int r : topo.local_ranks()) cfg.global_ranks.push_back(s.global_ranks[r]);
  // npu tensors live in shareable memfd segments of the npu allocator: let the engine map peers' tensors.
  const NpudistRuntimeApi* api = runtime_api();
  if (api && api->shared_memory_lookup) {
    auto lookup = api->shared_memory_lookup;
    cfg.shared_resolver = [lookup](const void* p, size_t bytes, shm::SharedBuffer* out) {
      NpudistSharedRef r{};
      if (!lookup(p, bytes, &r)) return false;
      *out = shm::SharedBuffer{r.fd, r.segment_id, r.segment_size, r.offset, r.epoch};
      return true;
    };
  }
  StoreBootstrap boot(s.store, s.key_prefix + "eng/n" + std::to_string(topo.node) + "/", s.connect_timeout);
  try {
    return std::make_unique<ShmCommunicator>(shm::ShmEngine::connect(cfg, boot));
  } catch (const comm::CommError& e) {
    if (e.kind == comm::FailureKind::kTimeout) throw ConnectTimeout(e.what(), e.ranks);
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: connecting the shared-memory communicator of group '", s.group_name,
                             "' failed on rank ", topo.rank, ": ", e.what()));
  } catch (const c10::DistStoreError& e) {
    throw ConnectTimeout(e.what(), {});  // a peer's connect-time keys never appeared
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: connecting the shared-memory communicator of group '", s.group_name,
                             "' failed on rank ", topo.rank, ": ", e.what()));
  }
}

// A Gloo communicator on its own key space of the group's store.
std::unique_ptr<comm::Communicator> connect_gloo(const CommunicatorSetup& s, const std::string& name, int rank,
                                                 int size) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(s.key_prefix + name, s.store);
  try {
    return GlooCommunicator::connect(store, rank, size, s.timeout);
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: connecting the Gloo communicator (", name, ") of group '", s.group_name,
                             "' failed on rank ", s.topology.rank, ": ", e.what()));
  }
}

}  // namespace

size_t default_buffer_bytes() { return shm::CommConfig{}.buffer_bytes; }

bool gloo_communicator_forced() {
  const char* v = std::getenv("NPUDIST_HCCL_COMMUNICATOR");
  const std::string s = v ? v : "";
  TORCH_CHECK_VALUE(s.empty() || s == "auto" || s == "gloo", "environment variable "
                    "NPUDIST_HCCL_COMMUNICATOR='", s,
                    "' is not a communicator choice; use 'auto' (by topology) or 'gloo'");
  return s == "gloo";
}

std::unique_ptr<comm::Communicator> make_communicator(const CommunicatorSetup& setup, bool gloo_only) {
  const Topology& topo = setup.topology;
  if (gloo_only) return connect_gloo(setup, "gloo_all", topo.rank, topo.size);
  if (topo.num_nodes() == 1) return connect_shm(setup);
  auto intra = connect_shm(setup);
  auto all = connect_gloo(setup, "gloo_all", topo.rank, topo.size);
  std::unique_ptr<comm::Communicator> leaders;
  if (topo.is_leader()) leaders = connect_gloo(setup, "gloo_leaders", topo.node, topo.num_nodes());
  return std::make_unique<HierarchicalCommunicator>(topo, std::move(intra), std::move(all), std::move(leaders));
}

}  // namespace npudist::hccl
