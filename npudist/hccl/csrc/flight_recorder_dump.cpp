// The torch side of the flight recorder: what an op records (sizes as ProcessGroupNCCL records them), and
// the dump in PyTorch's format, built with c10d's own keys, version and pickler (FlightRecorder.hpp,
// TraceUtils.h) so that torch.distributed.flight_recorder reads it as it reads an NCCL dump.
// (c10d's FlightRecorder<EventType> itself cannot be instantiated here: its definitions need
// nlohmann/json.hpp, which the torch wheel does not ship.)
#include "flight_recorder_dump.h"

#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>
#include <torch/csrc/distributed/c10d/TraceUtils.h>
#include <c10/util/thread_name.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "flight_recorder.h"
#include "process_group_hccl.h"

namespace npudist::hccl {
namespace {

// Writes the sizes and dtypes of one side (inputs or outputs) of an op into a reused recorder slot:
// existing inner vectors and strings are overwritten in place, so a slot that held a similar op before
// needs no allocation.
class SideWriter {
 public:
  SideWriter(std::vector<std::vector<int64_t>>& sizes, std::vector<std::string>& dtypes)
      : sizes_(sizes), dtypes_(dtypes) {}
  ~SideWriter() {
    sizes_.resize(ns_);
    dtypes_.resize(nd_);
  }
  std::vector<int64_t>& next_sizes() {
    if (ns_ == sizes_.size()) sizes_.emplace_back();
    auto& s = sizes_[ns_++];
    s.clear();
    return s;
  }
  void add_sizes(c10::IntArrayRef dims) { next_sizes().assign(dims.begin(), dims.end()); }
  void add_dtype(at::ScalarType t) {
    if (nd_ == dtypes_.size()) dtypes_.emplace_back();
    dtypes_[nd_++].assign(c10::toString(t));
  }

 private:
  std::vector<std::vector<int64_t>>& sizes_;
  std::vector<std::string>& dtypes_;
  size_t ns_ = 0, nd_ = 0;
};

void add_tensors(const std::vector<at::Tensor>& ts, SideWriter& w) {
  for (const auto& t : ts) {
    if (!t.defined()) continue;
    w.add_sizes(t.sizes());
    w.add_dtype(t.scalar_type());
  }
}

// A list of equally shaped tensors as one [n, *shape] tensor, as ProcessGroupNCCL flattens the per-rank
// list of all_gather / reduce_scatter before recording it; uneven lists stay as they are.
void add_flattened(const std::vector<at::Tensor>& ts, SideWriter& w) {
  bool even = !ts.empty();
  for (const auto& t : ts) even = even && t.defined() && t.sizes() == ts[0].sizes();
  if (!even) return add_tensors(ts, w);
  auto& flat = w.next_sizes();
  flat.push_back(static_cast<int64_t>(ts.size()));
  for (auto d : ts[0].sizes()) flat.push_back(d);
  w.add_dtype(ts[0].scalar_type());
}

// all_to_all with per-rank lists: the total element count, which is what fr_trace compares across ranks.
void add_total(const std::vector<at::Tensor>& ts, SideWriter& w) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.defined() ? t.numel() : 0;
  w.next_sizes().push_back(n);
  if (!ts.empty() && ts[0].defined()) w.add_dtype(ts[0].scalar_type());
}

// The issuing thread's name, as c10::getThreadName() reports it (a prctl system call, ~130 ns here), read
// again at most once per millisecond per thread: a thread renamed between two collectives less than 1 ms
// apart shows its previous name in the second entry. `now_ns` is the entry's creation time (the Work's issue
// time on the steady clock, read anyway).
const std::string& current_thread_name(int64_t now_ns) {
  static thread_local std::string name;
  static thread_local int64_t read_at_ns = 0;
  if (name.empty() || now_ns - read_at_ns >= 1'000'000) {
    name = c10::getThreadName();
    read_at_ns = now_ns;
  }
  return name;
}

// The adapter's op names in PyTorch's vocabulary (ProcessGroupNCCL's profiling titles, which fr_trace's
// COLLECTIVES / P2P sets list); every name the adapter issues is here.
const std::string& torch_op_name(const std::string& op) {
  static const std::unordered_map<std::string, std::string> names = {
      {"all_reduce", "all_reduce"},
      {"all_reduce_sparse", "all_reduce"},
      {"allreduce_coalesced", "allreduce_coalesced"},
      {"broadcast", "broadcast"},
      {"reduce", "reduce"},
      {"all_gather", "all_gather"},
      {"all_gather_into_tensor", "_all_gather_base"},
      {"allgather_coalesced", "ALLGATHER_coalesced"},
      {"allgather_into_tensor_coalesced", "all_gather_into_tensor_coalesced"},
      {"reduce_scatter", "reduce_scatter"},
      {"reduce_scatter_tensor", "_reduce_scatter_base"},
      {"reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced"},
      {"all_to_all", "all_to_all"},
      {"all_to_all_single", "all_to_all"},
      {"gather", "gather"},
      {"scatter", "scatter"},
      {"barrier", "barrier"},
      {"send", "send"},
      {"recv", "recv"},
      {"recv_anysource", "recv"},
  };
  auto it = names.find(op);
  return it == names.end() ? op : it->second;
}

// "hccl:all_reduce", "hccl:send 0->1" (from this rank to the peer), "hccl:recv 1<-0" (this rank from the peer),
// in group ranks, as ProcessGroupNCCL names p2p ops.
std::string profiling_name(const TraceEntry& e, int group_rank) {
  std::string name = "hccl:" + torch_op_name(e.op);
  if (e.p2p) {
    name += e.is_send ? c10::str(" ", group_rank, "->", e.peer) : c10::str(" ", group_rank, "<-", e.peer);
  }
  return name;
}

c10::List<c10::IValue> sizes_list(const std::vector<std::vector<int64_t>>& sizes) {
  auto out = c10d::new_list();
  for (const auto& s : sizes) {
    auto one = c10d::new_list();
    for (auto d : s) one.push_back(d);
    out.push_back(one);
  }
  return out;
}

c10::List<c10::IValue> strings_list(const std::vector<std::string>& v) {
  auto out = c10d::new_list();
  for (const auto& s : v) out.push_back(s);
  return out;
}

std::string desc_of(const GroupTrace& g) {
  return g.desc.empty() ? "undefined" : g.desc;  // ProcessGroup's description when none was given
}

// The group's global ranks as c10d's ranks_str writes them ("[0, 1]"); that helper formats with fmt, whose
// compiled part libtorch does not export.
std::string ranks_of(const GroupTrace& g) {
  const bool listed = static_cast<int>(g.global_ranks.size()) == g.size;  // else the world group
  std::string s = "[";
  for (int i = 0; i < g.size; ++i) {
    s += (i ? ", " : "") + std::to_string(listed ? g.global_ranks[i] : i);
  }
  return s + "]";
}

c10::Dict<c10::IValue, c10::IValue> entry_dict(const TraceEntry& e, const GroupTrace& g) {
  auto d = c10d::new_dict();
  d.insert(c10d::record_id_key, static_cast<int64_t>(e.record_id));
  d.insert(c10d::pg_id_key, static_cast<int64_t>(e.pg_id));
  d.insert(c10d::pg_name_key, std::make_tuple(g.name, desc_of(g)));
  d.insert(c10d::thread_name_key, e.thread_name);
  d.insert(c10d::thread_id_key, e.thread_id);
  d.insert(c10d::collective_seq_id_key, static_cast<int64_t>(e.collective_seq_id));
  d.insert(c10d::p2p_seq_id_key, static_cast<int64_t>(e.p2p_seq_id));
  d.insert(c10d::op_id_key, static_cast<int64_t>(e.op_id));
  d.insert(c10d::profiling_name_key, profiling_name(e, g.rank));
  d.insert(c10d::time_created_key, e.created_ns);
  if (e.completed_ns != 0 && e.started_ns != 0) {
    d.insert(c10d::duration_key, static_cast<double>(e.completed_ns - e.started_ns) / 1e6);
  }
  d.insert(c10d::input_sizes_key, sizes_list(e.input_sizes));
  d.insert(c10d::input_dtypes_key, strings_list(e.input_dtypes));
  d.insert(c10d::output_sizes_key, sizes_list(e.output_sizes));
  d.insert(c10d::output_dtypes_key, strings_list(e.output_dtypes));
  // PyTorch's states: a failed op started and never completed (as an NCCL kernel that errored or hung);
  // hccl_error says why.
  switch (e.state) {
    case TraceState::kCompleted: d.insert(c10d::state_key, c10d::completed_state); break;
    case TraceState::kScheduled: d.insert(c10d::state_key, c10d::scheduled_state); break;
    default: d.insert(c10d::state_key, c10d::started_state); break;
  }
  d.insert(c10d::time_discovered_started_key, e.started_ns ? c10::IValue(e.started_ns) : c10::IValue());
  d.insert(c10d::time_discovered_completed_key, e.completed_ns ? c10::IValue(e.completed_ns) : c10::IValue());
  d.insert(c10d::retired_key, e.retired);
  d.insert(c10d::timeout_key, e.timeout_ms);
  d.insert(c10d::is_p2p_key, e.p2p);
  // hccl's own keys (readers of PyTorch's format ignore them): what npudist's analyzer also compares.
  d.insert("hccl_reduce_op", e.reduce_op);
  d.insert("hccl_root", static_cast<int64_t>(e.root));
  if (e.state == TraceState::kFailed) d.insert("hccl_error", e.error);
  return d;
}

}  // namespace

uint64_t record_op(uint64_t pg_id, const std::string& name, const std::string& desc, const OpSpec& s,
                   uint64_t collective_seq, uint64_t p2p_seq, int64_t timeout_ms, int64_t created_ns,
                   bool started) {
  struct Ctx {
    const OpSpec& s;
    int64_t timeout_ms;
    const std::string& thread_id;
  };
  static thread_local const std::string thread_id = [] {
    std::ostringstream o;
    o << std::this_thread::get_id();
    return o.str();
  }();
  const Ctx ctx{s, timeout_ms, thread_id};
  auto fill = [](TraceEntry& e, const void* arg) {
    const Ctx& c = *static_cast<const Ctx*>(arg);
    const OpSpec& s = c.s;
    e.is_send = s.is_send;
    e.peer = s.peer;
    e.op.assign(s.name);
    e.reduce_op.assign(s.reduce_op);
    e.root = s.root;
    e.timeout_ms = c.timeout_ms;
    e.thread_name.assign(current_thread_name(e.created_ns));  // fill runs on the issuing thread
    e.thread_id.assign(c.thread_id);
    SideWriter in(e.input_sizes, e.input_dtypes), out(e.output_sizes, e.output_dtypes);
    switch (s.type) {
      case c10d::OpType::ALLGATHER:
        add_tensors(s.inputs, in);
        add_flattened(s.outputs, out);
        break;
      case c10d::OpType::REDUCE_SCATTER:
        add_flattened(s.inputs, in);
        add_tensors(s.outputs, out);
        break;
      case c10d::OpType::ALLTOALL:
        add_total(s.inputs, in);
        add_total(s.outputs, out);
        break;
      default:
        add_tensors(s.inputs, in);
        add_tensors(s.outputs, out);
    }
  };
  return FlightRecorder::get().record(pg_id, name, desc, s.p2p, collective_seq, p2p_seq, fill, &ctx, created_ns,
                                      started);
}

std::string dump_pickle(int global_rank, const std::string& reason) {
  const auto snap = FlightRecorder::get().snapshot();
  auto pg_config = c10d::new_dict();
  auto pg_status = c10d::new_dict();
  for (const auto& g : snap.groups) {
    auto info = c10d::new_dict();
    info.insert("name", g.name);
    info.insert("desc", desc_of(g));
    info.insert("ranks", ranks_of(g));
    pg_config.insert(g.name, info);
    auto status = c10d::new_dict();
    status.insert("last_enqueued_collective", g.last_enqueued);
    status.insert("last_started_collective", g.last_started);
    status.insert("last_completed_collective", g.last_completed);
    pg_status.insert(std::to_string(g.pg_id), status);
  }
  auto entries = c10d::new_list();
  for (const auto& e : snap.entries) entries.push_back(entry_dict(e, snap.groups.at(e.pg_id)));

  auto result = c10d::new_dict();
  result.insert(c10d::version_key, c10d::version_val);
  result.insert(c10d::pg_config_key, pg_config);
  result.insert(c10d::comm_lib_version_key, std::string("npudist-hccl"));
  result.insert(c10d::pg_status_key, pg_status);
  result.insert(c10d::entries_key, entries);
  result.insert("hccl_rank", static_cast<int64_t>(global_rank));
  result.insert("hccl_pid", static_cast<int64_t>(getpid()));
  result.insert("hccl_reason", reason);
  return c10d::pickle_str(result);
}

std::string dump_to_file(int global_rank, const std::string& reason) {
  const char* base = std::getenv("TORCH_HCCL_DEBUG_INFO_TEMP_FILE");
  const std::string path = std::string(base && *base ? base : "/tmp/hccl_trace_rank_") + std::to_string(global_rank);
  const std::string doc = dump_pickle(global_rank, reason);
  // Written aside and renamed, so a reader never sees half a dump.
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
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
