// ProcessGroupHCCL: construction (topology, shm communicator, Gloo between nodes), op launch and
// execution, Work, errors, watchdog, split/abort/shutdown. The collectives are in collectives.cpp.
#include "process_group_hccl.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

#include "npudist/runtime_c_api.h"

namespace npudist::hccl {

namespace {

const NpudistRuntimeApi* g_api = nullptr;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  TORCH_CHECK_VALUE(end && *end == '\0', "environment variable ", name, "='", v,
                    "' is not an integer; unset it or give a whole number");
  return static_cast<int>(x);
}

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string from_bytes(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// The engine's connect-time exchange over the group's store (keys under a per-node prefix).
struct StoreBootstrap : Bootstrap {
  StoreBootstrap(c10::intrusive_ptr<c10d::Store> s, std::string p, std::chrono::milliseconds t)
      : store(std::move(s)), prefix(std::move(p)), timeout(t) {}
  void set(const std::string& key, const std::string& value) override {
    store->set(prefix + key, to_bytes(value));
  }
  std::string get(const std::string& key) override {
    store->wait({prefix + key}, timeout);
    return from_bytes(store->get(prefix + key));
  }
  c10::intrusive_ptr<c10d::Store> store;
  std::string prefix;
  std::chrono::milliseconds timeout;
};

std::string random_token() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid()));
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(gen()));
  return std::string(buf, 12);
}

c10::SourceLocation here(const char* fn) { return c10::SourceLocation{fn, __FILE__, __LINE__}; }

std::function<c10::intrusive_ptr<c10d::Backend>(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                std::chrono::milliseconds)>
    g_gloo_factory;

}  // namespace

void set_runtime_api(uintptr_t address) {
  auto* api = reinterpret_cast<const NpudistRuntimeApi*>(address);
  TORCH_CHECK(api != nullptr, "npudist runtime API address is null");
  TORCH_CHECK(api->version == NPUDIST_RUNTIME_API_VERSION, "npudist runtime API version ",
              api->version, " != ", NPUDIST_RUNTIME_API_VERSION,
              " expected by npudist.hccl; rebuild both extensions");
  g_api = api;
}
const NpudistRuntimeApi* runtime_api() { return g_api; }

void set_gloo_factory(decltype(g_gloo_factory) f) { g_gloo_factory = std::move(f); }

// ------------------------------------------------------------------------------------------------
// Construction

ProcessGroupHCCL::ProcessGroupHCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   c10::intrusive_ptr<HCCLOptions> options)
    : c10d::Backend(rank, size),
      store_(store),
      options_(std::move(options)),
      coll_lane_("hccl_coll") {
  TORCH_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size, "invalid rank ", rank, " for size ", size);
  timeout_ = options_->timeout;
  const int exec_s = env_int("HCCL_EXEC_TIMEOUT", -1);
  if (!options_->timeout_from_user && exec_s > 0) timeout_ = std::chrono::seconds(exec_s);
  connect_timeout_ = options_->connect_timeout.count() > 0
                         ? options_->connect_timeout
                         : std::chrono::milliseconds(std::chrono::seconds(env_int("HCCL_CONNECT_TIMEOUT", 120)));
  buffer_bytes_ = options_->buffer_bytes;
  if (buffer_bytes_ == 0) {
    int mb = env_int("HCCL_BUFFSIZE", 0);
    TORCH_CHECK_VALUE(mb >= 0, "HCCL_BUFFSIZE must be a positive number of MB, got ", mb);
    buffer_bytes_ = mb > 0 ? static_cast<size_t>(mb) << 20 : CommConfig{}.buffer_bytes;
  }
  async_error_handling_ = env_int("TORCH_HCCL_ASYNC_ERROR_HANDLING", 1);
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
  recorder_ = std::make_shared<FlightRecorder>(
      options_->group_name, options_->group_desc, rank_, size_, granks,
      static_cast<size_t>(std::max(0, env_int("TORCH_HCCL_TRACE_BUFFER_SIZE", 2000))));
  register_recorder(recorder_);
  start_watchdog();
  init();
}

void ProcessGroupHCCL::connect() {
  // Keys are namespaced by how many hccl groups this rank built on this store before, so building
  // twice on one store (as torch may) pairs the k-th construction of every rank with each other.
  const std::string ns =
      "hccl" + std::to_string(store_->add("hccl_instances/" + std::to_string(rank_), 1)) + "/";
  // 1. Node identities -> topology.
  const std::string my_node = detect_node_id();
  store_->set(ns + "node/" + std::to_string(rank_), to_bytes(my_node));
  std::vector<std::string> keys, ids(size_);
  for (int r = 0; r < size_; ++r) keys.push_back(ns + "node/" + std::to_string(r));
  try {
    store_->wait(keys, connect_timeout_);
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: rank ", rank_, " of group '", options_->group_name,
                             "' waited ", connect_timeout_.count(),
                             " ms (HCCL_CONNECT_TIMEOUT) for all ranks to join: ", e.what()));
  }
  for (int r = 0; r < size_; ++r) ids[r] = from_bytes(store_->get(keys[r]));
  topo_ = build_topology(rank_, ids);

  // 2. A name unique to this job and group: rank 0 draws a token, everyone reads it.
  if (rank_ == 0) store_->set(ns + "token", to_bytes(random_token() + "_" + std::to_string(getpid())));
  store_->wait({ns + "token"}, connect_timeout_);
  const std::string token = from_bytes(store_->get(ns + "token"));
  // NPUDIST_JOB_ID (optional) prefixes the name, so a job's segments in /dev/shm are recognisable.
  std::string job;
  if (const char* j = std::getenv("NPUDIST_JOB_ID")) {
    for (const char* c = j; *c && job.size() < 16; ++c) {
      if (std::isalnum(static_cast<unsigned char>(*c))) job += *c;
    }
  }
  comm_name_ = (job.empty() ? "" : job + "_") + token + "_n" + std::to_string(topo_.node);

  // 3. The node's shared-memory communicator.
  CommConfig cfg;
  cfg.name = comm_name_;
  cfg.rank = topo_.local_rank;
  cfg.size = topo_.local_size();
  cfg.buffer_bytes = buffer_bytes_;
  cfg.timeout = timeout_;
  for (int r : topo_.local_ranks()) {
    const auto& g = options_->global_ranks_in_group;
    cfg.global_ranks.push_back(static_cast<int>(g.size()) == size_ ? static_cast<int>(g[r]) : r);
  }
  StoreBootstrap boot(store_, ns + "eng/n" + std::to_string(topo_.node) + "/", connect_timeout_);
  try {
    comm_ = Communicator::connect(cfg, boot);
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: connecting the shared-memory communicator of group '",
                             options_->group_name, "' failed on rank ", rank_, ": ", e.what()));
  }

  // 4. Several nodes: Gloo among all ranks (p2p, all_to_all, gather, scatter) and among leaders.
  if (topo_.num_nodes() > 1) {
    TORCH_CHECK(g_gloo_factory, "hccl: a multi-node group needs Gloo; import npudist.hccl first");
    auto all_store = c10::make_intrusive<c10d::PrefixStore>(ns + "gloo_all", store_);
    gloo_all_ = g_gloo_factory(all_store, rank_, size_, timeout_);
    if (topo_.is_leader()) {
      auto lead_store = c10::make_intrusive<c10d::PrefixStore>(ns + "gloo_leaders", store_);
      gloo_leaders_ = g_gloo_factory(lead_store, topo_.node, topo_.num_nodes(), timeout_);
    }
  }
}

void ProcessGroupHCCL::attach_gloo(c10::intrusive_ptr<c10d::Backend> all,
                                   c10::intrusive_ptr<c10d::Backend> leaders) {
  gloo_all_ = std::move(all);
  gloo_leaders_ = std::move(leaders);
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
  terminated_ = true;
  comm_.reset();  // unlinks the shared-memory segments
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
  child->timeout_from_user = options_->timeout_from_user;
  if (auto h = c10::dynamic_intrusive_pointer_cast<HCCLOptions>(opts)) {
    child->buffer_bytes = h->buffer_bytes;
    child->connect_timeout = h->connect_timeout;
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

// ------------------------------------------------------------------------------------------------
// Launch / execution

void ProcessGroupHCCL::check_usable(const char* op) {
  if (terminated_) {
    TORCH_CHECK(false, "hccl: ", op, " called on group '", options_->group_name,
                "' after it was shut down or destroyed; create a new group");
  }
  if (aborted_) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: ", op, " called on group '", options_->group_name,
                             "' after it was aborted (", abort_reason_,
                             "); destroy it and create a new group"));
  }
}

int64_t ProcessGroupHCCL::comm_stream(int device) {
  std::lock_guard<std::mutex> g(stream_mu_);
  auto it = comm_streams_.find(device);
  if (it != comm_streams_.end()) return it->second;
  auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
  c10::Device dev(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  c10::Stream s = impl->getStreamFromGlobalPool(dev, false);
  try {
    s = impl->getNewStream(dev, 0);
  } catch (const c10::Error&) {
    // The pool stream serves as well; a dedicated one only avoids sharing a queue with others.
  }
  comm_streams_[device] = s.id();
  return s.id();
}

namespace {

// Set by a host function on the caller's current npu stream once all work queued before it has run.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  static void open_fn(void* arg) {
    auto* g = static_cast<std::shared_ptr<Gate>*>(arg);
    {
      std::lock_guard<std::mutex> l((*g)->mu);
      (*g)->open = true;
    }
    (*g)->cv.notify_all();
    delete g;
  }
};

// Runs on the group's comm stream and returns once the op has completed, so the allocator (which
// tracks the comm stream through record_stream) reuses the op's memory only afterwards.
struct Fence {
  c10::intrusive_ptr<WorkHCCL> work;
  static void wait_fn(void* arg) {
    auto* f = static_cast<Fence*>(arg);
    f->work->block_until_done();
    delete f;
  }
};

int npu_device_of(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (const auto* v : {&a, &b}) {
    for (const auto& t : *v) {
      if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) return t.device().index();
    }
  }
  return -1;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::launch(OpSpec spec) {
  check_usable(spec.name);
  const int device = npu_device_of(spec.inputs, spec.outputs);
  if (device >= 0) {
    TORCH_CHECK(g_api != nullptr,
                "hccl: npu tensors need the device runtime; `import npudist` before using them");
  }
  std::lock_guard<std::mutex> issue(issue_mu_);
  const uint64_t seq = spec.p2p ? ++p2p_seq_ : ++seq_;
  TraceEntry te;
  te.seq = seq;
  te.p2p = spec.p2p;
  te.peer = spec.peer;
  te.op = spec.name;
  te.dtype = spec.dtype;
  te.reduce_op = spec.reduce_op;
  te.shapes = spec.shapes;
  te.root = spec.root;
  const uint64_t trace_id = recorder_->record(std::move(te));
  auto work = c10::make_intrusive<WorkHCCL>(this, std::move(spec), seq, trace_id);
  const auto& s = work->spec_;

  int64_t cur_stream = 0;
  if (device >= 0) {
    cur_stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
                     ->getStream(c10::Device(c10::DeviceType::PrivateUse1,
                                             static_cast<c10::DeviceIndex>(device)))
                     .id();
  }
  const bool stream_busy = device >= 0 && g_api->stream_query(device, cur_stream) == 0;

  if (!s.async && !s.p2p && coll_lane_.idle()) {
    // Synchronous op on the caller's thread: ordered after the current stream by draining it.
    if (stream_busy) g_api->stream_synchronize(device, cur_stream);
    execute(work);
    return work;
  }

  std::shared_ptr<Gate> gate;
  if (stream_busy) {
    gate = std::make_shared<Gate>();
    g_api->launch_host_func(device, cur_stream, &Gate::open_fn, new std::shared_ptr<Gate>(gate));
  }
  if (device >= 0) {
    const int64_t cs = comm_stream(device);
    c10::Stream stream(c10::Stream::UNSAFE,
                       c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)),
                       cs);
    for (const auto* v : {&s.inputs, &s.outputs}) {
      for (const auto& t : *v) {
        if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 && t.has_storage()) {
          t.record_stream(stream);
        }
      }
    }
    g_api->launch_host_func(device, cs, &Fence::wait_fn, new Fence{work});
  }
  {
    std::lock_guard<std::mutex> g(works_mu_);
    outstanding_.push_back(work);
  }
  auto task = [this, work, gate]() {
    if (gate) {
      std::unique_lock<std::mutex> l(gate->mu);
      if (!gate->cv.wait_for(l, timeout_, [&] { return gate->open; })) {
        work->complete(std::make_exception_ptr(c10::DistBackendError(
            here(__func__), c10::str("hccl: ", work->describe(),
                                     " gave up waiting for the npu stream it was issued on (",
                                     timeout_.count(), " ms)"))));
        return;
      }
    }
    execute(work);
  };
  if (s.p2p) {
    p2p_lane(s.peer, s.is_send).submit(std::move(task));
  } else {
    coll_lane_.submit(std::move(task));
  }
  return work;
}

Lane& ProcessGroupHCCL::p2p_lane(int peer, bool is_send) {
  std::lock_guard<std::mutex> g(p2p_mu_);
  auto& lane = p2p_lanes_[{peer, is_send}];
  if (!lane) lane = std::make_unique<Lane>((is_send ? "hccl_send" : "hccl_recv") + std::to_string(peer));
  return *lane;
}

void ProcessGroupHCCL::execute(const c10::intrusive_ptr<WorkHCCL>& work) {
  work->started_ = std::chrono::steady_clock::now();
  recorder_->mark_started(work->trace_id_);
  std::exception_ptr err;
  try {
    if (aborted_) {
      throw EngineError(ErrorKind::kAborted, "group was aborted: " + abort_reason_);
    }
    work->spec_.body(work->seq_);
  } catch (const EngineError& e) {
    err = translate_error(e, *work, true);
  } catch (const c10::ValueError& e) {
    err = std::current_exception();
  } catch (const c10::DistBackendError& e) {
    err = std::current_exception();
  } catch (const std::exception& e) {
    err = translate_error(e, *work, false);
  }
  work->complete(err);
}

std::exception_ptr ProcessGroupHCCL::translate_error(const std::exception& e, const WorkHCCL& w,
                                                     bool engine_error) {
  std::string kind = "failed";
  if (engine_error) {
    const auto& ee = static_cast<const EngineError&>(e);
    switch (ee.kind) {
      case ErrorKind::kTimeout:
        kind = c10::str("timed out after ", timeout_.count(), " ms");
        error_type_ = static_cast<int>(c10d::ErrorType::TIMEOUT);
        break;
      case ErrorKind::kPeerDied: kind = "failed: a peer process died"; break;
      case ErrorKind::kMismatch: kind = "failed: ranks called mismatched collectives"; break;
      case ErrorKind::kAborted: kind = "was aborted"; break;
      case ErrorKind::kInvalidArgument:
        return std::make_exception_ptr(c10::ValueError(
            here(__func__), c10::str("hccl: ", w.describe(), ": ", e.what())));
      case ErrorKind::kSystem: kind = "failed: system error"; break;
    }
    if (ee.kind != ErrorKind::kTimeout) error_type_ = static_cast<int>(c10d::ErrorType::COMM_ERROR);
  } else {
    error_type_ = static_cast<int>(c10d::ErrorType::COMM_ERROR);
  }
  return std::make_exception_ptr(c10::DistBackendError(
      here(__func__), c10::str("hccl: ", w.describe(), " ", kind, ": ", e.what())));
}

// ------------------------------------------------------------------------------------------------
// Work

WorkHCCL::WorkHCCL(ProcessGroupHCCL* pg, OpSpec spec, uint64_t seq, uint64_t trace_id)
    : c10d::Work(pg->getRank(), spec.type, nullptr),
      spec_(std::move(spec)),
      seq_(seq),
      trace_id_(trace_id),
      issued_(std::chrono::steady_clock::now()),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      pg_(pg) {}

std::string WorkHCCL::describe() const {
  return c10::str(spec_.name, spec_.p2p ? c10::str(" (p2p seq ", seq_, ", peer ", spec_.peer, ")")
                                        : c10::str(" (seq ", seq_, ")"),
                  " on group '", pg_->options_->group_name, "'",
                  pg_->getGroupDesc().empty() ? std::string() : " (" + pg_->getGroupDesc() + ")",
                  " (rank ", pg_->getRank(), " of ", pg_->getSize(), ")");
}

bool WorkHCCL::isCompleted() {
  std::lock_guard<std::mutex> g(mutex_);
  return completed_;
}

bool WorkHCCL::isSuccess() const {
  std::lock_guard<std::mutex> g(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr WorkHCCL::exception() const {
  std::lock_guard<std::mutex> g(mutex_);
  return exception_;
}

bool WorkHCCL::wait(std::chrono::milliseconds timeout) {
  observed_ = true;
  std::unique_lock<std::mutex> lk(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lk, [&] { return completed_; });
  } else if (!cv_.wait_for(lk, timeout, [&] { return completed_; })) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: ", describe(), " did not complete within the wait timeout of ",
                             timeout.count(), " ms"));
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void WorkHCCL::synchronize() { wait(kNoTimeout); }

void WorkHCCL::block_until_done() {
  std::unique_lock<std::mutex> lk(mutex_);
  cv_.wait(lk, [&] { return completed_; });
}

void WorkHCCL::abort() { pg_->abort(); }

float WorkHCCL::getDuration() const {
  std::lock_guard<std::mutex> g(mutex_);
  TORCH_CHECK(completed_, "hccl: getDuration() of an op that has not completed");
  return std::chrono::duration<float, std::milli>(finished_ - started_).count();
}

void WorkHCCL::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (completed_) return;
    finished_ = std::chrono::steady_clock::now();
    if (started_.time_since_epoch().count() == 0) started_ = finished_;
    completed_ = true;
    exception_ = error;
  }
  cv_.notify_all();
  std::string msg;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      msg = e.what();
    }
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(spec_.outputs));
  }
  pg_->recorder_->mark_done(trace_id_, msg);
  pg_->on_work_done(this);
}

// ------------------------------------------------------------------------------------------------
// Watchdog, abort, shutdown

void ProcessGroupHCCL::on_work_done(WorkHCCL* w) {
  std::lock_guard<std::mutex> g(works_mu_);
  if (w->exception()) {
    // Failed work stays listed until the watchdog has handled it.
    bool listed = false;
    for (auto& x : outstanding_) listed |= (x.get() == w);
    if (!listed) outstanding_.push_back(c10::intrusive_ptr<WorkHCCL>::unsafe_reclaim_from_nonowning(w));
    watchdog_cv_.notify_all();
    return;
  }
  outstanding_.remove_if([w](const auto& x) { return x.get() == w; });
}

void ProcessGroupHCCL::start_watchdog() {
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

void ProcessGroupHCCL::watchdog_loop() {
  pthread_setname_np(pthread_self(), "hccl_watchdog");
  std::unique_lock<std::mutex> lk(works_mu_);
  const auto margin = std::chrono::seconds(10);
  auto last_signal_check = std::chrono::steady_clock::now();
  while (!watchdog_stop_) {
    watchdog_cv_.wait_for(lk, std::chrono::milliseconds(200));
    if (watchdog_stop_) break;
    std::vector<c10::intrusive_ptr<WorkHCCL>> failed;
    const auto now = std::chrono::steady_clock::now();
    bool stuck = false;
    for (auto it = outstanding_.begin(); it != outstanding_.end();) {
      auto& w = *it;
      if (w->isCompleted()) {
        if (w->exception() && !w->error_handled_.exchange(true)) failed.push_back(w);
        it = outstanding_.erase(it);
        continue;
      }
      // The engine bounds every wait; a started op far past the deadline means a wedged worker.
      if (w->started_.time_since_epoch().count() != 0 && now - w->started_ > timeout_ + margin) {
        stuck = true;
      }
      ++it;
    }
    lk.unlock();
    if (dump_on_timeout_ && !dumped_ && now - last_signal_check > std::chrono::seconds(1)) {
      last_signal_check = now;
      try {
        if (store_->check({"hccl_dump_signal"})) {
          auto v = store_->get("hccl_dump_signal");
          dump_now("requested by a peer after: " + std::string(v.begin(), v.end()));
        }
      } catch (const std::exception&) {
        // Unreachable store: nothing to coordinate with.
      }
    }
    if (stuck && !aborted_) {
      abort_reason_ = "watchdog: an op exceeded the timeout by more than 10 s";
      aborted_ = true;
      if (comm_) comm_->abort(abort_reason_);
    }
    for (auto& w : failed) {
      std::string msg;
      bool user_error = false;
      try {
        std::rethrow_exception(w->exception());
      } catch (const c10::ValueError& e) {
        user_error = true;
      } catch (const std::exception& e) {
        msg = e.what();
      }
      if (user_error) continue;  // bad input: the communicator is intact
      // Dump on a communication failure (not on a user abort), and ask the other ranks to dump too.
      if (dump_on_timeout_ && !dumped_ && msg.find("was aborted") == std::string::npos) {
        dump_now(msg);
        try {
          store_->set("hccl_dump_signal", std::vector<uint8_t>(msg.begin(), msg.end()));
        } catch (const std::exception&) {
          // The store may be gone with a dead rank 0; the local dump is what matters.
        }
      }
      if (blocking_wait_ || async_error_handling_ == 0) continue;  // the error reaches wait() only
      if (async_error_handling_ == 1 || async_error_handling_ == 2) {
        if (!aborted_) {
          abort_reason_ = "watchdog after: " + msg;
          aborted_ = true;
          if (comm_) comm_->abort(abort_reason_);
        }
      }
      if (async_error_handling_ == 1 || async_error_handling_ == 3) {
        fprintf(stderr,
                "[rank %d] hccl watchdog: %s\n[rank %d] hccl watchdog: tearing down the process "
                "(TORCH_HCCL_ASYNC_ERROR_HANDLING=%d; set TORCH_HCCL_BLOCKING_WAIT=1 or "
                "TORCH_HCCL_ASYNC_ERROR_HANDLING=0 to handle the error in Python instead)\n",
                global_rank_, msg.c_str(), global_rank_, async_error_handling_);
        fflush(stderr);
        if (comm_) comm_->abort(msg);
        comm_.reset();  // unlink shared memory before dying
        std::_Exit(1);
      }
    }
    lk.lock();
  }
}

void ProcessGroupHCCL::dump_now(const std::string& reason) {
  dumped_ = true;
  const std::string path = dump_all_to_file(global_rank_, reason);
  if (!path.empty()) {
    fprintf(stderr, "[rank %d] hccl flight recorder dumped to %s\n", global_rank_, path.c_str());
  } else {
    fprintf(stderr, "[rank %d] hccl flight recorder dump failed (TORCH_HCCL_DEBUG_INFO_TEMP_FILE)\n",
            global_rank_);
  }
}

void ProcessGroupHCCL::abort() {
  if (!aborted_.exchange(true)) {
    abort_reason_ = "abort() was called";
  }
  if (comm_) comm_->abort(abort_reason_);
  if (gloo_all_) gloo_all_->abort();
  if (gloo_leaders_) gloo_leaders_->abort();
  // Fail what is still queued: execute() sees aborted_ and completes with an error.
}

void ProcessGroupHCCL::shutdown() {
  if (terminated_) return;
  // Let queued ops finish (each is bounded by the timeout), then release the communicator.
  coll_lane_.stop();
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    for (auto& kv : p2p_lanes_) kv.second->stop();
  }
  terminated_ = true;
  {
    std::lock_guard<std::mutex> g(works_mu_);
    watchdog_stop_ = true;
    watchdog_cv_.notify_all();
  }
  if (watchdog_.joinable() && watchdog_.get_id() != std::this_thread::get_id()) watchdog_.join();
  comm_.reset();
  if (gloo_all_) gloo_all_->shutdown();
  if (gloo_leaders_) gloo_leaders_->shutdown();
}

}  // namespace npudist::hccl
