#include "flight_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace npudist::hccl {

namespace {

// npudist.env validates the variable at import; an unparsable value here falls back to the default.
size_t capacity_from_env() {
  const char* v = std::getenv("TORCH_HCCL_TRACE_BUFFER_SIZE");
  if (v == nullptr || *v == '\0') return 2000;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || n < 0) return 2000;
  return static_cast<size_t>(n);
}

}  // namespace

FlightRecorder& FlightRecorder::get() {
  // Leaked on purpose: watchdogs of groups destroyed at exit may still dump.
  static FlightRecorder* instance = new FlightRecorder(capacity_from_env());
  return *instance;
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity) {
  ring_.reserve(std::min<size_t>(capacity_, 4096));
}

uint64_t FlightRecorder::add_group(std::string name, std::string desc, int rank, int size,
                                   std::vector<int64_t> global_ranks) {
  std::lock_guard<std::mutex> g(mu_);
  GroupTrace t;
  t.pg_id = groups_.size();
  t.name = std::move(name);
  t.desc = std::move(desc);
  t.rank = rank;
  t.size = size;
  t.global_ranks = std::move(global_ranks);
  groups_.push_back(std::move(t));
  return groups_.back().pg_id;
}

uint64_t FlightRecorder::record(uint64_t pg_id, const std::string& name, const std::string& desc, bool p2p,
                                uint64_t collective_seq_id, uint64_t p2p_seq_id, Fill fill, const void* ctx,
                                int64_t created, bool started) {
  std::lock_guard<std::mutex> g(mu_);
  GroupTrace& grp = groups_.at(pg_id);
  if (grp.name != name) grp.name = name;
  if (grp.desc != desc) grp.desc = desc;
  const uint64_t op_id = ++grp.ops;
  if (!p2p) grp.last_enqueued = static_cast<int64_t>(collective_seq_id);
  if (started && !p2p) grp.last_started = std::max(grp.last_started, static_cast<int64_t>(collective_seq_id));
  if (capacity_ == 0) return 0;
  const uint64_t record_id = next_record_++;
  if (ring_.size() < capacity_) ring_.emplace_back();
  // Once the ring is full, the oldest entry's slot, reused in place (its buffers keep their capacity).
  TraceEntry& e = ring_[record_id % capacity_];
  e.record_id = record_id;
  e.pg_id = pg_id;
  e.collective_seq_id = collective_seq_id;
  e.p2p_seq_id = p2p_seq_id;
  e.op_id = op_id;
  e.p2p = p2p;
  e.state = started ? TraceState::kStarted : TraceState::kScheduled;
  e.created_ns = created;
  e.started_ns = started ? created : 0;
  e.completed_ns = 0;
  e.retired = false;
  e.error.clear();
  fill(e, ctx);
  return record_id + 1;
}

TraceEntry* FlightRecorder::find_locked(uint64_t handle) {
  if (handle == 0 || ring_.empty()) return nullptr;
  TraceEntry& slot = ring_[(handle - 1) % capacity_];
  return slot.record_id + 1 == handle ? &slot : nullptr;  // overwritten entries are gone
}

void FlightRecorder::mark_started(uint64_t handle, uint64_t pg_id, uint64_t seq, int64_t at_ns) {
  std::lock_guard<std::mutex> g(mu_);
  if (seq != 0) {
    auto& grp = groups_.at(pg_id);
    grp.last_started = std::max(grp.last_started, static_cast<int64_t>(seq));
  }
  if (auto* e = find_locked(handle)) {
    e->state = TraceState::kStarted;
    e->started_ns = at_ns;
  }
}

void FlightRecorder::mark_done(uint64_t handle, uint64_t pg_id, uint64_t seq, const std::string& error,
                               int64_t at_ns) {
  std::lock_guard<std::mutex> g(mu_);
  if (seq != 0 && error.empty()) {
    auto& grp = groups_.at(pg_id);
    grp.last_completed = std::max(grp.last_completed, static_cast<int64_t>(seq));
  }
  if (auto* e = find_locked(handle)) {
    e->state = error.empty() ? TraceState::kCompleted : TraceState::kFailed;
    e->error = error;
    if (error.empty()) e->completed_ns = at_ns;
    e->retired = true;
  }
}

FlightRecorder::Snapshot FlightRecorder::snapshot() {
  std::lock_guard<std::mutex> g(mu_);
  Snapshot s;
  s.groups = groups_;
  s.entries = ring_;
  // Steady clock -> wall clock at this moment: the entries keep their spacing and read as of the dump.
  const int64_t to_wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count() -
                          steady_ns(std::chrono::steady_clock::now());
  for (TraceEntry& e : s.entries) {
    for (int64_t* t : {&e.created_ns, &e.started_ns, &e.completed_ns}) {
      if (*t != 0) *t += to_wall;
    }
  }
  std::sort(s.entries.begin(), s.entries.end(),
            [](const TraceEntry& a, const TraceEntry& b) { return a.record_id < b.record_id; });
  return s;
}

}  // namespace npudist::hccl
