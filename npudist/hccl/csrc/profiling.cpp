#include "profiling.h"

#include <mutex>
#include <sstream>
#include <unordered_map>

#include "process_group_hccl.h"

namespace npudist::hccl::profiling {

const NpudistProfilerApi* g_api = nullptr;

namespace {

struct Issued {
  const ProcessGroupHCCL* pg;
  uint64_t seq;
  int device;
  int64_t stream;
  uint64_t correlation;
};

// Works issued while recording, until they execute. Keyed by address; the (group, seq) check guards
// against a stale entry (issued while recording, executed after it stopped) whose address was reused.
std::mutex g_mu;
std::unordered_map<const WorkHCCL*, Issued> g_issued;
constexpr size_t kMaxPending = 65536;

int64_t total_numel(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) {
    if (t.defined()) n += t.numel();
  }
  return n;
}

std::string ranks_of(ProcessGroupHCCL& pg) {
  auto opts = pg.getBackendOptions();
  std::ostringstream s;
  s << "[";
  if (opts && !opts->global_ranks_in_group.empty()) {
    for (size_t i = 0; i < opts->global_ranks_in_group.size(); ++i) {
      s << (i ? ", " : "") << opts->global_ranks_in_group[i];
    }
  } else {
    for (int i = 0; i < pg.getSize(); ++i) s << (i ? ", " : "") << i;
  }
  s << "]";
  return s.str();
}

}  // namespace

void note_issue(const WorkHCCL& work, int device, int64_t stream) {
  if (device < 0 || !active()) return;
  std::lock_guard<std::mutex> g(g_mu);
  if (g_issued.size() >= kMaxPending) g_issued.clear();
  g_issued[&work] = Issued{work.pg_, work.seq_, device, stream, g_api->current_correlation()};
}

void CollectiveScope::begin(const WorkHCCL& work) {
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_issued.find(&work);
    if (it == g_issued.end()) return;
    const Issued l = it->second;
    g_issued.erase(it);
    if (l.pg != work.pg_ || l.seq != work.seq_) return;
    device_ = l.device;
    stream_ = l.stream;
    correlation_ = l.correlation;
  }
  work_ = &work;
  start_ns_ = g_api->now_ns();
}

void CollectiveScope::end() {
  const int64_t end_ns = g_api->now_ns();
  const OpSpec& s = work_->spec_;
  ProcessGroupHCCL& pg = *work_->pg_;
  const auto opts = pg.getBackendOptions();
  const std::string group_name = opts ? opts->group_name : std::string();
  const std::string group_desc = pg.getGroupDesc();
  const std::string ranks = ranks_of(pg);
  NpudistCollectiveEvent e{};
  e.name = s.name;
  e.dtype = s.dtype.c_str();
  e.group_name = group_name.c_str();
  e.group_desc = group_desc.c_str();
  e.group_ranks = ranks.c_str();
  e.device = device_;
  e.stream = stream_;
  e.start_ns = start_ns_;
  e.end_ns = end_ns;
  e.correlation = correlation_;
  e.in_nelems = total_numel(s.inputs);
  e.out_nelems = total_numel(s.outputs);
  e.seq = work_->seq_;
  e.group_size = pg.getSize();
  e.rank = pg.getRank();
  e.p2p = s.p2p ? 1 : 0;
  e.peer = s.p2p ? s.peer : -1;
  g_api->record_collective(&e);
}

void set_api(const NpudistProfilerApi* api) {
  TORCH_CHECK(api && api->version == NPUDIST_PROFILER_API_VERSION,
              "hccl: npudist._C and npudist.hccl._C were built from different sources (profiler table "
              "version mismatch); rebuild both extensions");
  g_api = api;
}

}  // namespace npudist::hccl::profiling
