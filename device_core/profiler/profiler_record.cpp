// Recording side of the npu profiler: the hooks the fallback, the copy kernel, the allocator and hccl
// call, the buffer they fill while a session is active, and the C table handed to npudist.hccl._C.
#include "profiler/profiler.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/extension.h>

#include <chrono>
#include <mutex>
#include <unordered_map>

#include "launch/launch.h"
#include "npu_tensor.h"
#include "npu_runtime.h"

namespace npudist::profiler {

std::atomic<int> g_active{0};

namespace {

// A session of a training step records some 10^4..10^5 events; the cap bounds memory if a profiler is
// left running (each record is ~150 bytes), and the overflow is reported as a session error.
constexpr size_t kMaxRecords = 2'000'000;

std::mutex g_mu;
std::vector<Record> g_records;
size_t g_dropped = 0;

thread_local std::vector<uint64_t> tls_correlation;

void append(Record&& r) {
  std::lock_guard<std::mutex> g(g_mu);
  if (!active()) return;  // the session stopped while this op ran
  if (g_records.size() >= kMaxRecords) {
    ++g_dropped;
    return;
  }
  g_records.push_back(std::move(r));
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// ---- memory: allocations made while memory profiling is on (their frees need the size) ----
struct LiveAlloc {
  size_t bytes;
  int device;
};
std::mutex g_mem_mu;
std::unordered_map<void*, LiveAlloc> g_live;
std::atomic<size_t> g_tracked{0};

std::pair<int64_t, int64_t> device_totals(int device) {
  // Through c10's registry (module.cpp registers the npu allocator there at import), not allocator/: the
  // allocator reports to the profiler, so the profiler reading the allocator room back would be a circle.
  auto* a = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(kNpu));
  if (!a) return {0, 0};
  try {
    auto s = a->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    constexpr size_t kAggregate = 0;
    return {s.allocated_bytes[kAggregate].current, s.reserved_bytes[kAggregate].current};
  } catch (const std::exception&) {
    return {0, 0};  // a pluggable allocator keeps no caching-allocator stats
  }
}

// ---- C table for npudist.hccl._C ----
uint64_t c_current_correlation() { return current_correlation(); }
int64_t c_now_ns() { return now_ns(); }

void c_record_collective(const NpudistCollectiveEvent* e) {
  if (!active()) return;
  Record r{Kind::kCollective, std::string("hccl:") + e->name, e->device, e->stream, e->start_ns, e->end_ns,
           e->correlation, {}};
  r.metadata = {
      {"Collective name", quoted(e->name)},
      {"dtype", quoted(e->dtype)},
      {"In msg nelems", std::to_string(e->in_nelems)},
      {"Out msg nelems", std::to_string(e->out_nelems)},
      {"Group size", std::to_string(e->group_size)},
      {"Process Group Name", quoted(e->group_name)},
      {"Process Group Description", quoted(e->group_desc)},
      {"Process Group Ranks", quoted(e->group_ranks)},
      {"Rank", std::to_string(e->rank)},
      {"Seq", std::to_string(e->seq)},
      {"stream", std::to_string(e->stream)},
  };
  if (e->p2p) r.metadata.emplace_back("Peer", std::to_string(e->peer));
  append(std::move(r));
}

const NpudistProfilerApi kApi = {
    NPUDIST_PROFILER_API_VERSION, &g_active, &c_current_correlation, &c_now_ns, &c_record_collective,
};

}  // namespace

void start_recording() {
  std::lock_guard<std::mutex> g(g_mu);
  g_records.clear();
  g_dropped = 0;
  if (g_active.exchange(1, std::memory_order_relaxed) == 0) launch::hold_synchronous(1);
}

std::vector<Record> stop_recording(size_t* dropped) {
  {
    // Blocks allocated during the session and still alive get no free event once it stops (none is recorded
    // then); forgetting them now keeps later frees off the map's mutex and a later session from seeing
    // frees of allocations it never saw.
    std::lock_guard<std::mutex> m(g_mem_mu);
    g_live.clear();
    g_tracked.store(0, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> g(g_mu);
  if (g_active.exchange(0, std::memory_order_relaxed) == 1) launch::hold_synchronous(-1);
  if (dropped) *dropped = g_dropped;
  std::vector<Record> out;
  out.swap(g_records);
  return out;
}

void push_correlation(uint64_t id) { tls_correlation.push_back(id); }

void pop_correlation() {
  // Profiling may have started inside an op whose push this thread never saw.
  if (!tls_correlation.empty()) tls_correlation.pop_back();
}

uint64_t current_correlation() { return tls_correlation.empty() ? 0 : tls_correlation.back(); }

int64_t now_ns() {
  // Kineto's time base: system_clock nanoseconds since the epoch (libkineto::timeSinceEpoch).
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

void KernelScope::begin(const c10::OperatorHandle& op, int device) {
  op_ = &op;
  device_ = device;
  stream_ = rt::api().get_stream(device);
  correlation_ = current_correlation();
  start_ns_ = now_ns();
}

void KernelScope::end() {
  const int64_t end_ns = now_ns();
  const auto& name = op_->schema().operator_name();
  Record r{Kind::kKernel, "npu:" + name.name, device_, stream_, start_ns_, end_ns, correlation_, {}};
  if (!name.overload_name.empty()) r.metadata.emplace_back("overload", quoted(name.overload_name));
  r.metadata.emplace_back("stream", std::to_string(stream_));
  append(std::move(r));
}

void CopyScope::begin(const at::Tensor& src, const at::Tensor& dst) {
  const bool from_npu = src.device().type() == kNpu;
  const bool to_npu = dst.device().type() == kNpu;
  name_ = from_npu && to_npu ? "Memcpy DtoD (npu)" : from_npu ? "Memcpy DtoH (npu)" : "Memcpy HtoD (npu)";
  device_ = to_npu ? dst.device().index() : src.device().index();
  stream_ = rt::api().get_stream(device_);
  bytes_ = static_cast<int64_t>(dst.numel()) * static_cast<int64_t>(dst.element_size());
  correlation_ = current_correlation();
  start_ns_ = now_ns();
}

void CopyScope::end() {
  const int64_t end_ns = now_ns();
  Record r{Kind::kMemcpy, name_, device_, stream_, start_ns_, end_ns, correlation_, {}};
  r.metadata = {{"bytes", std::to_string(bytes_)}, {"stream", std::to_string(stream_)}};
  append(std::move(r));
}

void report_alloc(void* ptr, size_t bytes, int device) {
  if (!ptr || !c10::memoryProfilingEnabled()) return;
  {
    std::lock_guard<std::mutex> g(g_mem_mu);
    g_live[ptr] = LiveAlloc{bytes, device};
    g_tracked.store(g_live.size(), std::memory_order_relaxed);
  }
  auto [allocated, reserved] = device_totals(device);
  c10::reportMemoryUsageToProfiler(ptr, static_cast<int64_t>(bytes), static_cast<size_t>(allocated),
                                   static_cast<size_t>(reserved), npu_device(device));
}

void report_free(void* ptr) {
  if (g_tracked.load(std::memory_order_relaxed) == 0) return;
  LiveAlloc a{};
  {
    std::lock_guard<std::mutex> g(g_mem_mu);
    auto it = g_live.find(ptr);
    if (it == g_live.end()) return;
    a = it->second;
    g_live.erase(it);
    g_tracked.store(g_live.size(), std::memory_order_relaxed);
  }
  if (!c10::memoryProfilingEnabled()) return;  // freed after the profiler stopped, or on another thread
  auto [allocated, reserved] = device_totals(a.device);  // before the free: report the totals after it
  const int64_t bytes = static_cast<int64_t>(a.bytes);
  c10::reportMemoryUsageToProfiler(ptr, -bytes, static_cast<size_t>(std::max<int64_t>(0, allocated - bytes)),
                                   static_cast<size_t>(reserved), npu_device(a.device));
}

const NpudistProfilerApi* c_api() { return &kApi; }

void init_bindings(pybind11::module_& m) {
  m.def("_profiler_api", [] {
          return pybind11::capsule(static_cast<const void*>(c_api()), NPUDIST_PROFILER_API_CAPSULE);
        },
        "The static NpudistProfilerApi table (profiler_c_api.h) as a PyCapsule named "
        "NPUDIST_PROFILER_API_CAPSULE, for npudist.hccl._C.");
  m.def("_profiler_recording", [] { return active(); },
        "True while a torch.profiler session records npu device activity.");
}

}  // namespace npudist::profiler
