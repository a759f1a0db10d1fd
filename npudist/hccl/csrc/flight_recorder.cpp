#include "flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace npudist::hccl {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::mutex g_registry_mu;
std::vector<std::weak_ptr<FlightRecorder>> g_registry;

}  // namespace

FlightRecorder::FlightRecorder(std::string group_name, std::string group_desc, int rank, int size,
                               std::vector<int64_t> global_ranks, size_t capacity)
    : group_name_(std::move(group_name)),
      group_desc_(std::move(group_desc)),
      rank_(rank),
      size_(size),
      global_ranks_(std::move(global_ranks)),
      capacity_(capacity) {
  ring_.reserve(std::min<size_t>(capacity_, 4096));
}

uint64_t FlightRecorder::record(TraceEntry e) {
  if (capacity_ == 0) return 0;
  std::lock_guard<std::mutex> g(mu_);
  e.id = next_id_++;
  e.t_issued_us = now_us();
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(e));
  } else {
    ring_[(e.id - 1) % capacity_] = std::move(e);
  }
  return next_id_ - 1;
}

TraceEntry* FlightRecorder::find_locked(uint64_t id) {
  if (id == 0 || ring_.empty()) return nullptr;
  TraceEntry& slot = ring_.size() < capacity_ ? ring_[id - 1] : ring_[(id - 1) % capacity_];
  return slot.id == id ? &slot : nullptr;  // overwritten entries are gone
}

void FlightRecorder::mark_started(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  if (auto* e = find_locked(id)) {
    e->state = "started";
    e->t_started_us = now_us();
    if (!e->p2p) last_started_seq_ = std::max(last_started_seq_, e->seq);
  }
}

void FlightRecorder::mark_done(uint64_t id, const std::string& error) {
  std::lock_guard<std::mutex> g(mu_);
  if (auto* e = find_locked(id)) {
    e->state = error.empty() ? "completed" : "failed";
    e->error = error;
    e->t_done_us = now_us();
    if (!e->p2p && error.empty()) last_completed_seq_ = std::max(last_completed_seq_, e->seq);
  }
}

std::string FlightRecorder::to_json() {
  std::lock_guard<std::mutex> g(mu_);
  std::ostringstream o;
  o << "{\"group_name\":" << quote(group_name_) << ",\"group_desc\":" << quote(group_desc_)
    << ",\"rank\":" << rank_ << ",\"size\":" << size_ << ",\"global_ranks\":[";
  for (size_t i = 0; i < global_ranks_.size(); ++i) o << (i ? "," : "") << global_ranks_[i];
  o << "],\"capacity\":" << capacity_ << ",\"last_started_seq\":" << last_started_seq_
    << ",\"last_completed_seq\":" << last_completed_seq_ << ",\"entries\":[";
  // Oldest first.
  std::vector<const TraceEntry*> order;
  for (const auto& e : ring_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->id < b->id; });
  bool first = true;
  for (const auto* e : order) {
    o << (first ? "" : ",") << "{\"id\":" << e->id << ",\"seq\":" << e->seq
      << ",\"p2p\":" << (e->p2p ? "true" : "false") << ",\"peer\":" << e->peer
      << ",\"op\":" << quote(e->op) << ",\"dtype\":" << quote(e->dtype)
      << ",\"reduce_op\":" << quote(e->reduce_op) << ",\"shapes\":" << quote(e->shapes)
      << ",\"root\":" << e->root << ",\"state\":" << quote(e->state)
      << ",\"t_issued_us\":" << e->t_issued_us << ",\"t_started_us\":" << e->t_started_us
      << ",\"t_done_us\":" << e->t_done_us << ",\"error\":" << quote(e->error) << "}";
    first = false;
  }
  o << "]}";
  return o.str();
}

void register_recorder(const std::shared_ptr<FlightRecorder>& r) {
  std::lock_guard<std::mutex> g(g_registry_mu);
  g_registry.erase(std::remove_if(g_registry.begin(), g_registry.end(),
                                  [](const auto& w) { return w.expired(); }),
                   g_registry.end());
  g_registry.push_back(r);
}

std::string dump_all_json(int global_rank, const std::string& reason) {
  std::vector<std::shared_ptr<FlightRecorder>> live;
  {
    std::lock_guard<std::mutex> g(g_registry_mu);
    for (auto& w : g_registry) {
      if (auto p = w.lock()) live.push_back(p);
    }
  }
  std::ostringstream o;
  o << "{\"version\":1,\"global_rank\":" << global_rank << ",\"pid\":" << getpid()
    << ",\"reason\":" << quote(reason) << ",\"time_us\":" << now_us() << ",\"groups\":[";
  for (size_t i = 0; i < live.size(); ++i) o << (i ? "," : "") << live[i]->to_json();
  o << "]}";
  return o.str();
}

std::string dump_all_to_file(int global_rank, const std::string& reason) {
  const char* base = std::getenv("TORCH_HCCL_DEBUG_INFO_TEMP_FILE");
  std::string path = std::string(base && *base ? base : "/tmp/hccl_trace_rank_") +
                     std::to_string(global_rank);
  std::string doc = dump_all_json(global_rank, reason);
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return "";
  bool ok = std::fwrite(doc.data(), 1, doc.size(), f) == doc.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return "";
  }
  return path;
}

}  // namespace npudist::hccl
