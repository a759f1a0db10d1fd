// ProcessGroupHCCL: construction (topology, the group's Communicator from communicator_factory.cpp),
// options and split. Issue/execution and Work: execution.cpp; watchdog, abort, shutdown: watchdog.cpp;
// the ops: collectives.cpp, exchange.cpp, point_to_point.cpp, barriers.cpp, sparse_all_reduce.cpp; their
// Communicator calls: communicator_calls.cpp.
#include "process_group_hccl.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

#include "communicator_factory.h"
#include "internal.h"
#include "npudist/runtime_c_api.h"

namespace npudist::hccl {

namespace {
const NpudistRuntimeApi* g_api = nullptr;
}  // namespace

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  TORCH_CHECK_VALUE(end && *end == '\0', "environment variable ", name, "='", v,
                    "' is not an integer; unset it or give a whole number");
  return static_cast<int>(x);
}

std::string deterministic_level() {
  const char* v = std::getenv("HCCL_DETERMINISTIC");
  std::string s = v ? v : "";
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s.empty()) return "false";
  TORCH_CHECK_VALUE(s == "false" || s == "true" || s == "strict", "environment variable HCCL_DETERMINISTIC='", v,
                    "' is not a determinism level; use false, true or strict");
  return s;
}

namespace {

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string from_bytes(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string random_token() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid()));
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(gen()));
  return std::string(buf, 12);
}

}  // namespace

void set_runtime_api(const NpudistRuntimeApi* api) {
  TORCH_CHECK(api != nullptr, "npudist runtime API address is null");
  // The table only grows at its end: any table at least as new as the header this was built with works.
  TORCH_CHECK(api->version >= NPUDIST_RUNTIME_API_VERSION, "npudist runtime API version ",
              api->version, " < ", NPUDIST_RUNTIME_API_VERSION,
              " expected by npudist.hccl; rebuild both extensions");
  g_api = api;
}
const NpudistRuntimeApi* runtime_api() { return g_api; }

namespace {
const NpudistLaunchApi* g_launch_api = nullptr;
}

void set_launch_api(const NpudistLaunchApi* api) {
  TORCH_CHECK(api && api->version == NPUDIST_LAUNCH_API_VERSION,
              "hccl: npudist._C and npudist.hccl._C were built from different sources (launch table version "
              "mismatch); rebuild both extensions");
  g_launch_api = api;
}
const NpudistLaunchApi* launch_api() { return g_launch_api; }

InlineLaunchScope::InlineLaunchScope() {
  if (g_launch_api) previous_ = g_launch_api->set_thread_inline(1);
}
InlineLaunchScope::~InlineLaunchScope() {
  if (g_launch_api) g_launch_api->set_thread_inline(previous_);
}

// ------------------------------------------------------------------------------------------------
// Construction

ProcessGroupHCCL::ProcessGroupHCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   c10::intrusive_ptr<HCCLOptions> options)
    : c10d::Backend(rank, size),
      store_(store),
      options_(std::move(options)),
      coll_lane_("hccl_coll") {
  TORCH_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size, "invalid rank ", rank, " for size ", size);
  // The op timeout: the group's (timeout=, 30 min by default); HCCL_EXEC_TIMEOUT when no timeout was given;
  // hccl_config['hccl_exec_timeout'] for this group, or the group's timeout= when that is shorter (on Ascend
  // the device's execution timer and the watchdog's both run: the first to expire fails the op).
  timeout_ = options_->timeout;
  timeout_source_ = options_->timeout_from_user ? "the group's timeout" : "the default group timeout";
  const int exec_s = env_int("HCCL_EXEC_TIMEOUT", -1);
  if (options_->exec_timeout.count() > 0) {
    if (!options_->timeout_from_user || options_->exec_timeout < timeout_) {
      timeout_ = options_->exec_timeout;
      timeout_source_ = "hccl_config['hccl_exec_timeout']";
    }
  } else if (!options_->timeout_from_user && exec_s > 0) {
    timeout_ = std::chrono::seconds(exec_s);
    timeout_source_ = "HCCL_EXEC_TIMEOUT";
  }
  connect_timeout_ = options_->connect_timeout.count() > 0
                         ? options_->connect_timeout
                         : std::chrono::milliseconds(std::chrono::seconds(env_int("HCCL_CONNECT_TIMEOUT", 120)));
  // CANN's buffer size sets the device memory the communicator holds (2 x it, device_buffers.cpp); the
  // engine's staging buffer in shared memory needs no more than its own default to run at full speed.
  hccl_buffer_bytes_ = options_->buffer_bytes;
  buffer_source_ = "hccl_config['hccl_buffer_size']";
  if (hccl_buffer_bytes_ == 0) {
    const int mb = env_int("HCCL_BUFFSIZE", kDefaultHcclBufferMb);
    TORCH_CHECK_VALUE(mb > 0, "HCCL_BUFFSIZE must be a positive number of MB, got ", mb);
    hccl_buffer_bytes_ = static_cast<size_t>(mb) << 20;
    buffer_source_ = "HCCL_BUFFSIZE";
  }
  buffer_bytes_ = std::min(hccl_buffer_bytes_, default_buffer_bytes());
  deterministic_ = deterministic_level();
  // HCCL_ASYNC_ERROR_HANDLING is torch_npu's older name of the same switch (deprecated there, still read).
  const int legacy_handling = env_int("HCCL_ASYNC_ERROR_HANDLING", -1);
  async_error_handling_ = env_int("TORCH_HCCL_ASYNC_ERROR_HANDLING", legacy_handling >= 0 ? legacy_handling : 1);
  const char* current_name = std::getenv("TORCH_HCCL_ASYNC_ERROR_HANDLING");
  if (legacy_handling >= 0 && (!current_name || !*current_name)) {  // an empty value is unset (env_int)
    TORCH_WARN_ONCE("HCCL_ASYNC_ERROR_HANDLING is deprecated, use TORCH_HCCL_ASYNC_ERROR_HANDLING instead");
  }
  monitoring_ = env_int("TORCH_HCCL_ENABLE_MONITORING", 0) != 0;
  heartbeat_timeout_ = std::chrono::seconds(std::max(1, env_int("TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC", 600)));
  blocking_wait_ = env_int("TORCH_HCCL_BLOCKING_WAIT", 0) != 0;
  dump_on_timeout_ = env_int("TORCH_HCCL_DUMP_ON_TIMEOUT", 0) != 0;
  global_rank_ = env_int("RANK", rank);
  if (!options_->global_ranks_in_group.empty() &&
      static_cast<int>(options_->global_ranks_in_group.size()) == size) {
    global_rank_ = static_cast<int>(options_->global_ranks_in_group[rank]);
  }
  connect();
  std::vector<int64_t> granks(options_->global_ranks_in_group.begin(),
                              options_->global_ranks_in_group.end());
  trace_pg_id_ = FlightRecorder::get().add_group(options_->group_name, options_->group_desc, rank_, size_,
                                                 std::move(granks));
  start_watchdog();
  init();
}

void ProcessGroupHCCL::connect() {
  const bool gloo_only = gloo_communicator_forced();  // a bad value fails here, before any rank waits
  // Keys are namespaced by how many hccl groups this rank built on this store before, so building
  // twice on one store (as torch may) pairs the k-th construction of every rank with each other.
  if (ns_base_.empty()) {
    ns_base_ = "hccl" + std::to_string(store_->add("hccl_instances/" + std::to_string(rank_), 1)) + "/";
  }
  // A communicator rebuilt after reinit meets under its generation's keys, so no key of an earlier one is read.
  const uint64_t gen = generation_.load();
  const std::string ns = gen == 0 ? ns_base_ : ns_base_ + "gen" + std::to_string(gen) + "/";
  // A rebuild happens inside the group's next op, so that op's deadline (the group's timeout) bounds it.
  const std::chrono::milliseconds wait = gen == 0 ? connect_timeout_ : timeout_;
  // 1. Node identities -> topology.
  const std::string my_node = detect_node_id();
  store_->set(ns + "node/" + std::to_string(rank_), to_bytes(my_node));
  std::vector<std::string> keys, ids(size_);
  for (int r = 0; r < size_; ++r) keys.push_back(ns + "node/" + std::to_string(r));
  try {
    store_->wait(keys, wait);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      try {
        if (!store_->check({keys[r]})) missing.push_back(r);
      } catch (const std::exception&) {
        missing.push_back(r);  // the store itself is gone: nobody can be confirmed
      }
    }
    throw_connect_timeout(missing, e.what());
  }
  for (int r = 0; r < size_; ++r) ids[r] = from_bytes(store_->get(keys[r]));
  topo_ = build_topology(rank_, ids);

  // 2. A name unique to this job and group: rank 0 draws a token, everyone reads it. A rebuilt communicator
  // keeps the group's name (get_hccl_comm_name stays valid); its segments get the generation as a suffix.
  if (gen == 0) {
    if (rank_ == 0) store_->set(ns + "token", to_bytes(random_token() + "_" + std::to_string(getpid())));
    try {
      store_->wait({ns + "token"}, connect_timeout_);
    } catch (const std::exception& e) {
      throw_connect_timeout({0}, e.what());
    }
    const std::string token = from_bytes(store_->get(ns + "token"));
    // NPUDIST_JOB_ID (optional) prefixes the name, so a job's segments in /dev/shm are recognisable.
    std::string job;
    if (const char* j = std::getenv("NPUDIST_JOB_ID")) {
      for (const char* c = j; *c && job.size() < 16; ++c) {
        if (std::isalnum(static_cast<unsigned char>(*c))) job += *c;
      }
    }
    comm_name_ = (job.empty() ? "" : job + "_") + token + "_n" + std::to_string(topo_.node);
  }

  // 3. The group's communicator, chosen once from the topology.
  CommunicatorSetup setup;
  setup.store = store_;
  setup.key_prefix = ns;
  setup.name = gen == 0 ? comm_name_ : comm_name_ + "_g" + std::to_string(gen);
  setup.group_name = options_->group_name;
  setup.topology = topo_;
  const auto& g = options_->global_ranks_in_group;
  for (int r = 0; r < size_; ++r) {
    setup.global_ranks.push_back(static_cast<int>(g.size()) == size_ ? static_cast<int>(g[r]) : r);
  }
  setup.buffer_bytes = buffer_bytes_;
  setup.timeout = timeout_;
  setup.connect_timeout = wait;
  try {
    auto made = make_communicator(setup, gloo_only);
    std::lock_guard<std::mutex> lock(comm_mu_);
    comm_ = std::move(made);
  } catch (const ConnectTimeout& e) {
    std::vector<int> missing;  // the engine names global ranks; the message names group ranks
    for (int g : e.ranks) {
      const auto& gr = setup.global_ranks;
      const auto it = std::find(gr.begin(), gr.end(), g);
      missing.push_back(it == gr.end() ? g : static_cast<int>(it - gr.begin()));
    }
    throw_connect_timeout(missing, e.what());
  }
}

void ProcessGroupHCCL::throw_connect_timeout(const std::vector<int>& missing, const std::string& detail) {
  std::string who;
  for (int r : missing) {
    const auto& g = options_->global_ranks_in_group;
    who += (who.empty() ? "" : ", ") + std::to_string(static_cast<int>(g.size()) == size_ ? g[r] : r);
  }
  if (generation_ > 0) {
    // The rebuild after reinit_process_group: the peers named did not rebuild theirs (reinit.cpp).
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: ", rebuild_op_ ? rebuild_op_ : "an op", " on group '", options_->group_name,
                             "' (rank ", global_rank_, "): rebuilding its communicator after reinit_process_group "
                             "(generation ", generation_.load(), ") timed out after ", timeout_.count() / 1000.0,
                             " s (the group's timeout): ", missing.empty() ? std::string("a peer") : "ranks [" + who + "]",
                             " of its ", size_, " did not arrive. Every rank of the group must call "
                             "torch_npu.distributed.reinit_process_group(group) and then issue an op on the group, "
                             "which rebuilds the communicator on all of them; this rank tries again at its next op "
                             "on the group. (", detail, ")"));
  }
  // EI0006 is CANN's code for a communicator whose links were not set up in time: the code Ascend users
  // search their logs for, with CANN's reading of it.
  C10_THROW_ERROR(DistBackendError,
                  c10::str("hccl: EI0006: getting the socket connections of the communicator of group '",
                           options_->group_name, "' timed out on rank ", global_rank_, " after ",
                           connect_timeout_.count() / 1000.0, " s (HCCL_CONNECT_TIMEOUT): ",
                           missing.empty() ? std::string("a peer") : "ranks [" + who + "]",
                           " of its ", size_, " did not join. A rank that does not create this group (every rank "
                           "must call init_process_group/new_group in the same order), that is still busy, or "
                           "that exited leaves the others waiting; raise HCCL_CONNECT_TIMEOUT (default 120 s) "
                           "when ranks reach the group far apart. (", detail, ")"));
}

ProcessGroupHCCL::~ProcessGroupHCCL() {
  {
    std::lock_guard<std::mutex> g(works_mu_);
    watchdog_stop_ = true;
    watchdog_cv_.notify_all();
  }
  if (watchdog_.joinable()) watchdog_.join();
  coll_lane_.stop();
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    for (auto& kv : p2p_lanes_) kv.second->stop();
  }
  if (monitor_.joinable()) monitor_.join();
  terminated_ = true;
  comm_.reset();  // unlinks the shared-memory segments
  release_device_buffers();
}

void ProcessGroupHCCL::setTimeout(std::chrono::milliseconds timeout) {
  // The engine fixes its wait deadline at connect time; only the adapter-side deadlines follow.
  timeout_ = timeout;
  options_->timeout = timeout;
}

void ProcessGroupHCCL::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  if (options_->group_name.empty()) options_->group_name = pg_uid;
}

c10d::ErrorType ProcessGroupHCCL::getError() {
  return static_cast<c10d::ErrorType>(error_type_.load());
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupHCCL::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  std::lock_guard<std::mutex> split_guard(split_mu_);
  if (opts && !opts->group_name.empty() && opts->group_name == last_split_name_) {
    if (auto same = last_split_.lock()) return same;
  }
  auto child = c10::make_intrusive<HCCLOptions>(options_->timeout);
  child->buffer_bytes = options_->buffer_bytes;
  child->connect_timeout = options_->connect_timeout;
  child->exec_timeout = options_->exec_timeout;
  child->timeout_from_user = options_->timeout_from_user;
  if (auto h = c10::dynamic_intrusive_pointer_cast<HCCLOptions>(opts)) {
    child->buffer_bytes = h->buffer_bytes;
    child->connect_timeout = h->connect_timeout;
    child->exec_timeout = h->exec_timeout;
  }
  if (opts) {
    child->timeout = opts->timeout;
    child->group_name = opts->group_name;
    child->group_desc = opts->group_desc;
  }
  for (int r : ranks) {
    child->global_ranks_in_group.push_back(
        static_cast<int>(options_->global_ranks_in_group.size()) == size_
            ? options_->global_ranks_in_group[r]
            : r);
  }
  auto made = c10::make_intrusive<ProcessGroupHCCL>(store, static_cast<int>(it - ranks.begin()),
                                                    static_cast<int>(ranks.size()), child);
  last_split_name_ = child->group_name;
  last_split_ = c10::weak_intrusive_ptr<c10d::Backend>(c10::intrusive_ptr<c10d::Backend>(made));
  return made;
}

}  // namespace npudist::hccl
