// ShmEngine construction, the step machinery, failure handling and abort (see shm_engine_impl.h).
#include "shm_engine_impl.h"

#include <cstdlib>
#include <cstring>

#include "diagnostics.h"

namespace npudist::shm {

std::unique_ptr<ShmEngine> ShmEngine::connect(const CommConfig& cfg, Bootstrap& bootstrap) {
  auto seg = detail::Segment::connect(cfg, bootstrap);
  return std::make_unique<detail::ShmEngineImpl>(cfg, std::move(seg));
}

}  // namespace npudist::shm

namespace npudist::shm::detail {
namespace {

size_t env_kib(const char* name, size_t def_bytes) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def_bytes;
  long long kib = std::strtoll(v, nullptr, 10);
  return kib > 0 ? static_cast<size_t>(kib) * 1024 : def_bytes;
}

}  // namespace

ShmEngineImpl::ShmEngineImpl(const CommConfig& cfg, std::unique_ptr<Segment> seg)
    : cfg_(cfg), seg_(std::move(seg)), rank_(cfg.rank), size_(cfg.size) {
  half_ = seg_->buffer_bytes() / 2;
  // Small pipeline steps keep the staging data in cache; tunable for experiments.
  pipe_bytes_ = std::min(half_, env_kib("NPUDIST_ENGINE_CHUNK_KB", 256 * 1024));
  // Reductions sync every rank once or twice per step while each rank's share of a step is short work
  // (copy n-1 segments, reduce one), so the syncs dominate at 256 KiB, the more so with more ranks than
  // cores; 1 MiB steps still stay in L2/L3 (A/B in BENCHMARKS.md, "Collectives").
  reduce_pipe_bytes_ = std::min(half_, env_kib("NPUDIST_ENGINE_REDUCE_CHUNK_KB", 1024 * 1024));
  one_shot_bytes_ = std::min(half_, env_kib("NPUDIST_ENGINE_ONESHOT_KB", 64 * 1024));
  stream_bytes_ = env_kib("NPUDIST_ENGINE_STREAM_KB", 4096 * 1024);
  direct_bytes_ = env_kib("NPUDIST_ENGINE_DIRECT_KB", 512 * 1024);
  // From 32 MiB the staged pipeline, where sender and receiver copy at the same time, catches up with direct
  // mode for all_gather and all_to_all (docs/hccl_engine.md, "Algorithms"); broadcast's reach is longer.
  direct_max_bytes_ = env_kib("NPUDIST_ENGINE_DIRECT_MAX_KB", 32 * 1024 * 1024);
  zc_bytes_ = env_kib("NPUDIST_ENGINE_ZERO_COPY_KB", 256 * 1024);
  // For A/B runs (engine_bench's VAR=VALUE): 0 sends tiny ops through the descriptors and staging slots.
  // Ranks may disagree safely: a rank without keys makes every rank take the slots (tiny.cpp).
  const char* tiny = std::getenv("NPUDIST_ENGINE_TINY");
  tiny_enabled_ = !(tiny && tiny[0] == '0' && tiny[1] == '\0');
  srcs_.resize(size_);
  peer_descs_.resize(size_);
  a2a_offsets_.resize(size_);
  peer_maps_.resize(size_);
  p2p_maps_.resize(size_);
  zc_src_.resize(size_);
  zc_dst_.resize(size_);
  ctx_.spin_ns = spin_ns_for(size_);
  ctx_.timeout = cfg_.timeout;
  ctx_.abort_flag = &seg_->header()->aborted;
  ctx_.peer_alive = [this](int peer) { return process_alive(seg_->ctl(peer)->proc); };
  ctx_.on_fail = [this](int why, int peer) { fail_wait(why, peer); };
  probe_peer_access();
}

ShmEngineImpl::~ShmEngineImpl() { unmap_all_shared(); }

int ShmEngineImpl::global_rank(int r) const {
  return r < static_cast<int>(cfg_.global_ranks.size()) ? cfg_.global_ranks[r] : r;
}

std::string ShmEngineImpl::rank_list(const std::vector<int>& local) const {
  std::string s = "[";
  for (size_t i = 0; i < local.size(); ++i) s += (i ? ", " : "") + std::to_string(global_rank(local[i]));
  return s + "]";
}

std::string ShmEngineImpl::describe_peer_state(int r) const {
  const RankCtl* c = seg_->ctl(r);
  const OpDesc& a = c->desc[0];
  const OpDesc& b = c->desc[1];
  const OpDesc& d = a.step >= b.step ? a : b;
  std::string who = "rank " + std::to_string(global_rank(r));
  if (!c->attached.load(std::memory_order_acquire)) return who + " has not attached yet";
  if (d.kind == OpKind::kNone) return who + " has not started any collective on this communicator";
  return who + " last entered " + describe_op(d);
}

OpDesc ShmEngineImpl::make_desc(OpKind kind, const CollectiveInfo& info, uint64_t count, int root) const {
  OpDesc d{};
  d.kind = kind;
  d.seq = info.seq;
  d.count = count;
  d.root = root;
  d.scale = 1.0;
  std::strncpy(d.name, info.op ? info.op : "", sizeof(d.name) - 1);
  return d;
}

void ShmEngineImpl::check_usable() {
  if (broken_) throw CommError(broken_->kind, broken_->what(), broken_->ranks);
  if (seg_->header()->aborted.load(std::memory_order_acquire)) throw_aborted();
}

void ShmEngineImpl::begin(const OpDesc& d, const size_t* a2a_send, const size_t* a2a_recv,
                            const size_t* a2a_send_offsets) {
  check_usable();
  ctx_.deadline = {};  // set by the op's first wait that outlasts its spin (WaitContext)
  cur_ = d;
  cur_.step = step_ + 1;
  RankCtl* me = seg_->ctl(rank_);
  const int parity = static_cast<int>(cur_.step & 1);
  if (a2a_send) {
    for (int j = 0; j < size_; ++j) {
      me->a2a[parity][0][j] = a2a_send[j];
      me->a2a[parity][1][j] = a2a_recv[j];
      me->a2a[parity][2][j] = a2a_send_offsets ? a2a_send_offsets[j] : 0;
    }
  }
  me->desc[parity] = cur_;
  set_tiny_key();
  check_pending_ = true;
}

void ShmEngineImpl::sync() {
  const uint64_t s = step_ + 1;
  if (check_pending_) post_tiny_key();
  seg_->ctl(rank_)->step.post(s);
  wait_target_ = s;
  for (int j = 0; j < size_; ++j) {
    if (j != rank_) wait_at_least(seg_->ctl(j)->step, s, j, ctx_);
  }
  step_ = s;
  if (check_pending_) {
    check_pending_ = false;
    // Equal tiny keys are descriptors the check accepts; a tiny op reads nothing of the peers' descriptors.
    // Every rank sees every key, so all ranks agree whether the data travels in the lines (tiny_ stays
    // true) or in the staging slots, which a tiny op writes too.
    tiny_ = tiny_ && peers_match_tiny_key();
    if (!tiny_) {
      snapshot_descriptors();
      check_descriptors();
    }
  }
}

// Every rank posted this op's first step and none can post the next one before this rank does, so no
// peer can be writing the slots read here (a peer writes the slot of this parity again only when it
// begins the op after next, which needs this rank's next post).
void ShmEngineImpl::snapshot_descriptors() {
  const int parity = static_cast<int>(step_ & 1);
  for (int j = 0; j < size_; ++j) {
    const RankCtl* c = seg_->ctl(j);
    peer_descs_[j] = c->desc[parity];
    a2a_offsets_[j] = cur_.kind == OpKind::kAllToAll ? c->a2a[parity][2][rank_] : 0;
  }
}

void ShmEngineImpl::check_descriptors() {
  const int parity = static_cast<int>(step_ & 1);
  bool all_same = true;
  const OpDesc& mine = seg_->ctl(rank_)->desc[parity];
  for (int j = 0; j < size_ && all_same; ++j) {
    all_same = j == rank_ || same_op(mine, seg_->ctl(j)->desc[parity]);
  }
  std::string problem;
  std::vector<int> culprits;
  if (!all_same) {
    problem = describe_mismatch(*seg_, size_, parity, [this](int r) { return global_rank(r); }, &culprits);
    // A rank whose descriptor belongs to another step is out of lock-step: the communicator cannot recover.
    bool desync = false;
    for (int j = 0; j < size_; ++j) desync |= seg_->ctl(j)->desc[parity].step != step_;
    CommError err(FailureKind::kMismatch,
                    "npudist engine: mismatched collective on communicator '" + cfg_.name + "' (rank " +
                        std::to_string(global_rank(rank_)) + "): " + problem,
                    culprits);
    if (desync) broken_ = err;
    throw err;
  }
  if (cur_.kind == OpKind::kAllToAll) {
    problem = check_all_to_all_counts(*seg_, size_, parity, [this](int r) { return global_rank(r); },
                                      &culprits);
    if (!problem.empty())
      throw CommError(FailureKind::kMismatch,
                        "npudist engine: mismatched all_to_all split sizes on communicator '" + cfg_.name +
                            "': " + problem,
                        culprits);
  }
}

void ShmEngineImpl::throw_aborted() {
  SegHeader* h = seg_->header();
  for (int i = 0; i < 100000 && h->aborted.load(std::memory_order_acquire) == 2; ++i) sched_yield();
  std::string reason(h->abort_reason, strnlen(h->abort_reason, sizeof(h->abort_reason)));
  throw CommError(FailureKind::kAborted,
                    "npudist engine: communicator '" + cfg_.name + "' was aborted: " + reason);
}

void ShmEngineImpl::fail_wait(int why, int peer) {
  if (why == kWhyAborted) throw_aborted();
  std::string op = describe_op(cur_);
  if (why == kWhyPeerDied) {
    const RankCtl* c = seg_->ctl(peer);
    broken_ = CommError(FailureKind::kPeerDied,
                          "npudist engine: rank " + std::to_string(global_rank(peer)) + " (pid " +
                              std::to_string(c->proc.pid) + ") exited while rank " +
                              std::to_string(global_rank(rank_)) + " waited for it in " + op +
                              " on communicator '" + cfg_.name + "'; the communicator is unusable",
                          {global_rank(peer)});
    throw *broken_;
  }
  std::vector<int> missing;
  std::string states;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_ || seg_->ctl(j)->step.value.load(std::memory_order_acquire) >= wait_target_) continue;
    missing.push_back(j);
    states += "; " + describe_peer_state(j);
  }
  std::vector<int> gmissing;
  for (int j : missing) gmissing.push_back(global_rank(j));
  broken_ = CommError(FailureKind::kTimeout,
                        "npudist engine: " + op + " on communicator '" + cfg_.name + "' timed out after " +
                            std::to_string(cfg_.timeout.count()) + " ms on rank " +
                            std::to_string(global_rank(rank_)) + ": ranks " + rank_list(missing) +
                            " did not arrive" + states,
                        gmissing);
  throw *broken_;
}

void ShmEngineImpl::abort(const std::string& reason) {
  SegHeader* h = seg_->header();
  uint32_t expected = 0;
  if (h->aborted.compare_exchange_strong(expected, 2, std::memory_order_acq_rel)) {
    std::string r = reason.empty() ? "abort() called" : reason;
    r += " (by rank " + std::to_string(global_rank(rank_)) + ")";
    std::strncpy(h->abort_reason, r.c_str(), sizeof(h->abort_reason) - 1);
    h->aborted.store(1, std::memory_order_release);
  }
  for (int j = 0; j < size_; ++j) {
    seg_->ctl(j)->step.wake_all();
    for (int k = 0; k < size_; ++k) {
      if (j == k) continue;
      seg_->chan(j, k)->sent.wake_all();
      seg_->chan(j, k)->acked.wake_all();
    }
  }
}

}  // namespace npudist::shm::detail
