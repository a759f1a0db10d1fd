// Torch adapter of the caching allocator core: the c10::DeviceAllocator for PrivateUse1 (npu), OOM ->
// torch.OutOfMemoryError, Python stack capture for snapshots, the pluggable-allocator switch and the
// memory bindings used by npudist/device/memory.py (torch.npu.memory).
#include "npu_allocator.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/extension.h>

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "caching_allocator.h"
#include "host_allocator.h"
#include "launch.h"
#include "npu_runtime.h"
#include "npu_tensor.h"
#include "profiler.h"

// From torch/csrc/profiler/python/combined_traceback.h (exported by libtorch_python), declared here
// because that header needs nlohmann/json.hpp, which torch wheels do not ship.
namespace torch {
std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
void installCapturedTracebackPython();
}  // namespace torch

namespace npudist::memory {
namespace {

using alloc::CachingAllocator;
constexpr size_t kSwappedHeader = 4096;

// The core's device: the runtime's C table. Markers are runtime events owned by a shared_ptr.
struct RuntimeHooks final : alloc::DeviceHooks {
  int device_count() override { return rt::device_count(); }
  size_t device_capacity(int d) override {
    NpudistDeviceProperties p{};
    rt::check(rt::api().get_device_properties(d, &p));
    return p.total_memory;
  }
  std::shared_ptr<void> record_marker(int d, int64_t s) override {
    NpudistEvent e = nullptr;
    rt::check(rt::api().event_create(&e));
    std::shared_ptr<void> marker(e, [](void* ev) { rt::api().event_destroy(static_cast<NpudistEvent>(ev)); });
    rt::check(rt::api().event_record(e, d, s));
    return marker;
  }
  bool marker_done(const std::shared_ptr<void>& m) override {
    return rt::api().event_query(static_cast<NpudistEvent>(m.get())) != 0;
  }
  void marker_wait(const std::shared_ptr<void>& m) override {
    rt::check(rt::api().event_synchronize(static_cast<NpudistEvent>(m.get())));
  }
  void synchronize_device(int d) override { rt::check(rt::api().device_synchronize(d)); }
  void* map_segment(int d, size_t size) override {
    void* p = nullptr;
    return rt::api().malloc(d, size, &p) == NPUDIST_SUCCESS ? p : nullptr;
  }
  void unmap_segment(void* ptr, size_t size) override { rt::api().free(ptr, size); }
  void* reserve_address(size_t size) override {
    void* p = nullptr;
    return rt::api().reserve_address(size, &p) == NPUDIST_SUCCESS ? p : nullptr;
  }
  void release_address(void* base, size_t size) override { rt::api().release_address(base, size); }
  bool commit_pages(void* ptr, size_t size) override {
    return rt::api().map_memory(ptr, size) == NPUDIST_SUCCESS;
  }
  void decommit_pages(void* ptr, size_t size) override { rt::api().unmap_memory(ptr, size); }
  size_t external_bytes(int d) override { return rt::api().comm_buffer_bytes(d); }
  std::string external_description(int d) override {
    std::string text(rt::api().comm_buffer_describe(d, nullptr, 0) + 1, '\0');
    const size_t n = rt::api().comm_buffer_describe(d, text.data(), text.size());
    text.resize(std::min(n, text.size() - 1));  // a charge may have come or gone between the calls
    return text;
  }
};

// ---- the core, created on first use (device configuration and env are read then) and never destroyed:
// tensors may outlive static destruction at interpreter exit.
std::mutex g_core_mu;
std::atomic<CachingAllocator*> g_core{nullptr};
std::atomic<bool> g_used{false};

CachingAllocator* core() {
  CachingAllocator* c = g_core.load(std::memory_order_acquire);
  if (c) return c;
  std::lock_guard<std::mutex> lock(g_core_mu);
  if ((c = g_core.load())) return c;
  const char* conf = std::getenv("PYTORCH_NPU_ALLOC_CONF");
  alloc::AllocatorConfig cfg;
  try {
    cfg = alloc::parse_allocator_config(conf ? conf : "");
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  const char* nocache = std::getenv("PYTORCH_NO_NPU_MEMORY_CACHING");
  bool caching = !(nocache && std::strcmp(nocache, "0") != 0 && *nocache);
  c = new CachingAllocator(std::make_shared<RuntimeHooks>(), std::move(cfg), caching);
  g_core.store(c, std::memory_order_release);
  // The emulated device keeps working in forked children (e.g. DataLoader workers).
  pthread_atfork([] { g_core.load()->lock_all(); }, [] { g_core.load()->unlock_all(); },
                 [] { g_core.load()->unlock_all(); });
  return c;
}

// ---- stack capture for _record_memory_history: 0 none, 1 state, 2 alloc, 3 all (also on free).
std::atomic<int> g_context_level{0};
std::atomic<bool> g_context_cpp{false};

alloc::Context gather_context(int min_level) {
  if (g_context_level.load(std::memory_order_relaxed) < min_level) return {};
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, g_context_cpp.load());
}

// ---- pluggable allocator (NPUPluggableAllocator): allocation functions from a user .so.
using PlugAlloc = void* (*)(size_t size, int device, void* stream);
using PlugFree = void (*)(void* ptr, size_t size, int device, void* stream);
struct PlugInfo {
  size_t size;
  int device;
  int64_t stream;
};
std::atomic<PlugAlloc> g_plug_alloc{nullptr};
std::atomic<PlugFree> g_plug_free{nullptr};
std::mutex g_plug_mu;
std::unordered_map<void*, PlugInfo> g_plug_live;

void* stream_handle(int64_t id) { return reinterpret_cast<void*>(static_cast<intptr_t>(id)); }

[[noreturn]] void rethrow_oom(const alloc::OutOfMemoryError& e) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
}

void raw_delete(void* ptr) {
  profiler::report_free(ptr);
  if (g_plug_free.load(std::memory_order_acquire)) {
    PlugInfo info{};
    bool plug = false;
    {
      std::lock_guard<std::mutex> lock(g_plug_mu);
      auto it = g_plug_live.find(ptr);
      if (it != g_plug_live.end()) {
        info = it->second;
        plug = true;
        g_plug_live.erase(it);
      }
    }
    if (plug) {
      g_plug_free.load()(ptr, info.size, info.device, stream_handle(info.stream));
      return;
    }
  }
  core()->free(ptr, gather_context(3));
}

void* raw_alloc(size_t n, int dev, int64_t stream) {
  if (n == 0) return nullptr;
  if (PlugAlloc fn = g_plug_alloc.load(std::memory_order_acquire)) {
    void* p = fn(n, dev, stream_handle(stream));
    TORCH_CHECK_WITH(OutOfMemoryError, p, "NPU out of memory: the pluggable allocator returned NULL for ", n,
                     " bytes on npu:", dev);
    std::lock_guard<std::mutex> lock(g_plug_mu);
    g_plug_live[p] = PlugInfo{n, dev, stream};
    return p;
  }
  alloc::Context ctx = gather_context(1);  // before the allocator lock: may take the GIL
  if (!g_used.load(std::memory_order_relaxed)) g_used.store(true, std::memory_order_relaxed);
  for (bool retried = false;; retried = true) {
    try {
      return core()->malloc(dev, n, stream, ctx);
    } catch (const alloc::OutOfMemoryError& e) {
      // Kernels that ran may still hold their arguments until the host releases them (launch.h): retry once
      // after releasing them.
      if (retried || !launch::release_finished()) rethrow_oom(e);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  }
}

// Finished kernels first (launch.h): what they still hold can then be returned too.
void empty_cache() {
  launch::release_finished();
  core()->empty_cache();
}

void check_native(const char* what) {
  TORCH_CHECK(!g_plug_alloc.load(), what, " is not available while a pluggable allocator "
              "(torch.npu.memory.change_current_allocator) is active; it reports the caching allocator");
}

void check_device(int d) {
  TORCH_CHECK_VALUE(d >= 0 && d < rt::device_count(), "invalid npu device index ", d, " (there are ",
                    rt::device_count(), " visible npu devices)");
}

c10::CachingDeviceAllocator::DeviceStats to_c10(const alloc::DeviceStats& s) {
  c10::CachingDeviceAllocator::DeviceStats out;
  auto conv = [](const alloc::Stat& a, c10::CachingDeviceAllocator::Stat& b) {
    b.current = a.current;
    b.peak = a.peak;
    b.allocated = a.allocated;
    b.freed = a.freed;
  };
  auto conv_arr = [&](const alloc::StatArray& a, c10::CachingDeviceAllocator::StatArray& b) {
    for (size_t i = 0; i < alloc::kNumStatTypes; ++i) conv(a[i], b[i]);
  };
  conv_arr(s.allocation, out.allocation);
  conv_arr(s.segment, out.segment);
  conv_arr(s.active, out.active);
  conv_arr(s.inactive_split, out.inactive_split);
  conv_arr(s.allocated_bytes, out.allocated_bytes);
  conv_arr(s.reserved_bytes, out.reserved_bytes);
  conv_arr(s.active_bytes, out.active_bytes);
  conv_arr(s.inactive_split_bytes, out.inactive_split_bytes);
  conv_arr(s.requested_bytes, out.requested_bytes);
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  conv(s.oversize_allocations, out.oversize_allocations);
  conv(s.oversize_segments, out.oversize_segments);
  out.num_sync_all_streams = s.num_sync_all_streams;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  out.num_oom_rejections = s.num_oom_rejections;
  out.max_split_size = s.max_split_size;
  return out;
}

class NpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    int dev = rt::current_device();
    void* p = raw_alloc(n, dev, rt::api().get_stream(dev));
    profiler::report_alloc(p, n, dev);
    return {p, p, &raw_delete, c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool initialized() override { return g_core.load() != nullptr; }
  void emptyCache(c10::MempoolId_t) override { empty_cache(); }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override { record_stream(ptr, stream); }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    check_native("memory statistics");
    check_device(d);
    return to_c10(core()->stats(d));
  }
  void resetAccumulatedStats(c10::DeviceIndex d) override {
    check_device(d);
    core()->reset_accumulated_stats(d);
  }
  void resetPeakStats(c10::DeviceIndex d) override {
    check_device(d);
    core()->reset_peak_stats(d);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    check_device(d);
    return core()->mem_info(d);
  }
};

NpuAllocator g_allocator;

// ---- swapped memory (torch_npu.empty_with_swapped_memory): npu tensors whose bytes are host memory outside
// the device budget. A swapped storage is recognised by its deleter (free_swapped): the caching allocator
// neither owns nor counts it, so memory_allocated and the capacity ignore it, and record_stream skips it.
// On Ascend the bytes are host memory mapped into the device's address space, as here; the npu kernels reach
// them like any npu bytes (which operators may run on them is decided in npudist/device/swapped_memory.py).
std::atomic<int64_t> g_swapped_bytes{0};

void free_swapped(void* ctx) {
  auto* size = static_cast<size_t*>(ctx);
  g_swapped_bytes.fetch_sub(static_cast<int64_t>(*size));
  std::free(size);
}

class SwappedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    int dev = rt::current_device();
    // One allocation holds the size (for the counter) in front of page-aligned data.
    void* raw = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&raw, kSwappedHeader, kSwappedHeader + n) == 0 && raw,
                     "empty_with_swapped_memory: host allocation of ", n, " bytes failed (out of host memory)");
    *static_cast<size_t*>(raw) = n;
    g_swapped_bytes.fetch_add(static_cast<int64_t>(n));
    void* data = static_cast<char*>(raw) + kSwappedHeader;
    return {data, raw, &free_swapped, c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }  // data and context differ
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

SwappedAllocator g_swapped_allocator;

at::Tensor empty_with_swapped_memory(const std::vector<int64_t>& sizes, c10::ScalarType dtype, int device) {
  check_device(device);
  for (int64_t s : sizes) TORCH_CHECK_VALUE(s >= 0, "empty_with_swapped_memory: negative dimension ", s, " in ", sizes);
  DeviceScope scope(device);
  at::Tensor t = at::detail::empty_generic(sizes, &g_swapped_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           dtype, std::nullopt);
  // Its bytes must stay where they are: a resize would move them into the caching allocator.
  t.storage().unsafeGetStorageImpl()->set_resizable(false);
  return t;
}

bool is_swapped(const at::Tensor& t) {
  return t.has_storage() && t.storage().data_ptr().get_deleter() == &free_swapped;
}

}  // namespace

c10::Allocator* allocator() { return &g_allocator; }

bool owns(void* ptr) {
  if (!ptr) return false;
  if (CachingAllocator* c = g_core.load(std::memory_order_acquire); c && c->owns(ptr)) return true;
  if (!g_plug_alloc.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(g_plug_mu);
  return g_plug_live.count(ptr) > 0;
}

// Whether record_stream / erase_stream track the memory behind data_ptr: only blocks of the caching allocator;
// pluggable allocations and empty storages have nothing to protect (a pluggable allocator owns its own reuse).
static bool tracks_streams(const c10::DataPtr& data_ptr, c10::Stream stream, const char* what) {
  if (!data_ptr.get() || data_ptr.get_deleter() != &raw_delete) return false;
  TORCH_CHECK_VALUE(stream.device_type() == c10::DeviceType::PrivateUse1, what, ": expected an npu stream, got ",
                    stream);
  std::lock_guard<std::mutex> lock(g_plug_mu);
  return !g_plug_live.count(data_ptr.get());
}

bool stream_ordered(const c10::DataPtr& data_ptr, int64_t stream) {
  if (!data_ptr.get() || data_ptr.get_deleter() != &raw_delete) return false;
  CachingAllocator* c = core();
  if (!c->caching_enabled()) return false;
  if (g_plug_free.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_plug_mu);
    if (g_plug_live.count(data_ptr.get())) return false;
  }
  return c->stream_of(data_ptr.get()) == stream;
}

void record_stream(const c10::DataPtr& data_ptr, c10::Stream stream) {
  if (tracks_streams(data_ptr, stream, "record_stream")) core()->record_stream(data_ptr.get(), stream.id());
}

// torch_npu.erase_stream: undoes record_stream(stream) once the caller made the tensor's stream wait for it.
static void erase_stream(const at::Tensor& tensor, c10::Stream stream) {
  TORCH_CHECK_VALUE(tensor.device().type() == c10::DeviceType::PrivateUse1,
                    "erase_stream: expected an npu tensor, got a tensor on ", tensor.device());
  TORCH_CHECK_VALUE(stream.device_index() == tensor.device().index(), "erase_stream: the stream is on npu:",
                    static_cast<int>(stream.device_index()), " and the tensor on ", tensor.device(),
                    "; pass a stream of the tensor's device");
  const c10::DataPtr& data_ptr = tensor.storage().data_ptr();
  if (tracks_streams(data_ptr, stream, "erase_stream")) core()->erase_stream(data_ptr.get(), stream.id());
}

// ---------------------------------------------------------------------------------------------------
// Python bindings (torch.npu.memory), named after torch._C._cuda_* counterparts.
// ---------------------------------------------------------------------------------------------------
namespace {
namespace py = pybind11;

py::dict stat_dict(const alloc::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict stat_array_dict(const alloc::StatArray& a) {
  py::dict d;
  d["all"] = stat_dict(a[alloc::kAggregate]);
  d["small_pool"] = stat_dict(a[alloc::kSmallPool]);
  d["large_pool"] = stat_dict(a[alloc::kLargePool]);
  return d;
}

// Same layout as torch._C._cuda_memoryStats (torch.cuda.memory_stats_as_nested_dict).
py::dict memory_stats(int device) {
  check_native("torch.npu.memory_stats");
  check_device(device);
  alloc::DeviceStats s = core()->stats(device);
  py::dict r;
  r["num_alloc_retries"] = s.num_alloc_retries;
  r["num_ooms"] = s.num_ooms;
  r["max_split_size"] = s.max_split_size;
  r["num_sync_all_streams"] = s.num_sync_all_streams;
  r["num_device_alloc"] = s.num_device_alloc;
  r["num_device_free"] = s.num_device_free;
  r["num_oom_rejections"] = s.num_oom_rejections;
  r["allocation"] = stat_array_dict(s.allocation);
  r["segment"] = stat_array_dict(s.segment);
  r["active"] = stat_array_dict(s.active);
  r["inactive_split"] = stat_array_dict(s.inactive_split);
  r["allocated_bytes"] = stat_array_dict(s.allocated_bytes);
  r["reserved_bytes"] = stat_array_dict(s.reserved_bytes);
  r["active_bytes"] = stat_array_dict(s.active_bytes);
  r["inactive_split_bytes"] = stat_array_dict(s.inactive_split_bytes);
  r["requested_bytes"] = stat_array_dict(s.requested_bytes);
  py::dict by_pool;
  for (const auto& [id, st] : s.reserved_bytes_by_private_pools)
    by_pool[py::make_tuple(id.first, id.second)] = stat_array_dict(st);
  r["reserved_bytes_by_private_pools"] = by_pool;
  r["oversize_allocations"] = stat_dict(s.oversize_allocations);
  r["oversize_segments"] = stat_dict(s.oversize_segments);
  // npudist's own key: device memory hccl communicators hold outside the allocator (2 x HCCL_BUFFSIZE each).
  py::dict comm;
  comm["current"] = static_cast<int64_t>(rt::api().comm_buffer_bytes(device));
  r["hccl_buffer_bytes"] = comm;
  return r;
}

const char* state_name(alloc::BlockState s) {
  switch (s) {
    case alloc::BlockState::kActiveAllocated: return "active_allocated";
    case alloc::BlockState::kActivePendingFree: return "active_pending_free";
    default: return "inactive";
  }
}

// Symbolizes all captured stacks at once (frames are shared between tracebacks).
struct FrameTable {
  std::vector<torch::CapturedTraceback*> tbs;
  std::vector<py::object> lists;
  std::vector<std::pair<py::dict, size_t>> pending;
  void attach(py::dict d, const alloc::Context& ctx) {
    if (!ctx) {
      d["frames"] = py::list();
      return;
    }
    pending.emplace_back(d, tbs.size());
    tbs.push_back(static_cast<torch::CapturedTraceback*>(ctx.get()));
  }
  void resolve() {
    if (tbs.empty()) return;
    lists = torch::py_symbolize(tbs);
    for (auto& p : pending) p.first["frames"] = lists[p.second];
  }
};

py::dict allocator_settings() {
  alloc::AllocatorConfig c = core()->config();
  py::dict d;
  d["PYTORCH_NPU_ALLOC_CONF"] = c.source;
  d["caching"] = core()->caching_enabled();
  d["max_split_size"] = c.max_split_size == SIZE_MAX ? -1 : static_cast<int64_t>(c.max_split_size);
  d["garbage_collection_threshold"] = c.garbage_collection_threshold;
  d["expandable_segments"] = c.expandable_segments;
  py::dict rd;
  for (size_t i = 0; i < alloc::kRoundupIntervals; ++i) {
    std::string key = i + 1 == alloc::kRoundupIntervals ? ">" : std::to_string(size_t(1) << i);
    rd[py::str(key)] = c.roundup_power2_divisions[i];
  }
  d["roundup_power2_divisions"] = rd;
  return d;
}

// Same structure as torch._C._cuda_memorySnapshot: {segments, device_traces, allocator_settings}.
py::dict memory_snapshot() {
  check_native("torch.npu.memory._snapshot");
  std::vector<alloc::SegmentInfo> segs;
  std::vector<std::vector<alloc::TraceEntry>> traces;
  {
    py::gil_scoped_release nogil;
    segs = core()->snapshot();
    traces = core()->traces();
  }
  FrameTable frames;
  py::list segments;
  for (const auto& s : segs) {
    py::dict sd;
    sd["device"] = s.device;
    sd["address"] = s.address;
    sd["total_size"] = s.total_size;
    sd["allocated_size"] = s.allocated_size;
    sd["active_size"] = s.active_size;
    sd["requested_size"] = s.requested_size;
    sd["stream"] = s.stream;
    sd["segment_type"] = s.is_large ? "large" : "small";
    sd["segment_pool_id"] = py::make_tuple(s.pool_id.first, s.pool_id.second);
    sd["is_expandable"] = s.is_expandable;
    sd["frames"] = py::list();
    py::list blocks;
    for (const auto& b : s.blocks) {
      py::dict bd;
      bd["address"] = b.address;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = state_name(b.state);
      frames.attach(bd, b.context);
      blocks.append(bd);
    }
    sd["blocks"] = blocks;
    segments.append(sd);
  }
  py::list device_traces;
  for (const auto& dev_trace : traces) {
    py::list entries;
    for (const auto& e : dev_trace) {
      py::dict ed;
      ed["action"] = alloc::action_name(e.action);
      ed["addr"] = e.addr;
      ed["size"] = e.size;
      ed["stream"] = e.stream;
      ed["time_us"] = e.time_us;
      if (e.action == alloc::Action::kOom) ed["device_free"] = e.device_free;
      frames.attach(ed, e.context);
      entries.append(ed);
    }
    device_traces.append(entries);
  }
  frames.resolve();
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = device_traces;
  out["allocator_settings"] = allocator_settings();
  return out;
}

void record_memory_history(const std::optional<std::string>& enabled, const std::optional<std::string>& context,
                           const std::string& stacks, size_t max_entries, bool clear_history,
                           const std::vector<std::string>& skip_actions) {
  TORCH_CHECK_VALUE(!enabled || *enabled == "state" || *enabled == "all",
                    "_record_memory_history: enabled must be None, 'state' or 'all', got '", *enabled, "'");
  TORCH_CHECK_VALUE(!context || *context == "state" || *context == "alloc" || *context == "all",
                    "_record_memory_history: context must be None, 'state', 'alloc' or 'all', got '",
                    *context, "'");
  TORCH_CHECK_VALUE(stacks == "python" || stacks == "all",
                    "_record_memory_history: stacks must be 'python' or 'all', got '", stacks, "'");
  alloc::HistoryOptions h;
  int level = 0;
  if (enabled) {
    h.record_state = true;
    h.record_trace = *enabled == "all";
    if (context) level = *context == "state" ? 1 : *context == "alloc" ? 2 : 3;
  }
  h.context_on_trace = level >= 2;
  h.context_on_free = level == 3;
  h.max_entries = max_entries;
  for (const auto& a : skip_actions) {
    alloc::Action act;
    TORCH_CHECK_VALUE(alloc::parse_action(a, &act), "_record_memory_history: unknown action '", a,
                      "' in skip_actions; valid: alloc, free_requested, free_completed, segment_alloc, "
                      "segment_free, segment_map, segment_unmap, snapshot, oom");
    h.skip.push_back(act);
  }
  if (level > 0) torch::installCapturedTracebackPython();
  g_context_cpp.store(stacks == "all");
  g_context_level.store(level);
  core()->record_history(h, clear_history);
}

// ---- private pools (torch.npu.MemPool): thin wrappers over the core's, with its errors as ValueError.
using PoolIdArg = std::pair<uint64_t, uint64_t>;
std::atomic<uint64_t> g_next_user_pool{1};

template <typename Fn>
auto pool_call(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, what, ": ", e.what());
  }
}

void check_pools_usable(const char* what) {
  TORCH_CHECK(!g_plug_alloc.load(), what, " is not available while a pluggable allocator "
              "(torch.npu.memory.change_current_allocator) serves every npu allocation: it has no pools. Give "
              "the allocator to the pool instead: torch.npu.MemPool(allocator=...)");
}

void create_pool(int device, PoolIdArg id, uintptr_t alloc_fn, uintptr_t free_fn, bool use_on_oom, bool no_split) {
  check_device(device);
  check_pools_usable("torch.npu.MemPool");
  alloc::PoolOptions opts;
  opts.use_on_oom = use_on_oom;
  opts.no_split = no_split;
  if (alloc_fn) {
    TORCH_CHECK_VALUE(free_fn, "MemPool: the allocator has no free function");
    auto fa = reinterpret_cast<PlugAlloc>(alloc_fn);
    auto ff = reinterpret_cast<PlugFree>(free_fn);
    opts.source = std::make_shared<alloc::SegmentSource>();
    opts.source->alloc = [fa](int d, size_t size, int64_t stream) { return fa(size, d, stream_handle(stream)); };
    opts.source->free = [ff](void* p, size_t size, int d, int64_t stream) { ff(p, size, d, stream_handle(stream)); };
  }
  pool_call("MemPool", [&] { core()->create_pool(device, id, opts); });
}

void begin_allocate_current_thread_to_pool(int device, PoolIdArg id) {
  check_device(device);
  check_pools_usable("torch.npu.use_mem_pool");
  g_used.store(true);  // an allocator swap after this would orphan the pool
  std::thread::id me = std::this_thread::get_id();
  pool_call("use_mem_pool", [&] {
    core()->begin_allocate_to_pool(device, id, [me](int64_t) { return std::this_thread::get_id() == me; });
  });
}

void attach_oom_observer(py::function fn) {
  auto holder = std::make_shared<py::function>(std::move(fn));
  core()->attach_oom_observer([holder](int device, size_t requested, size_t total, size_t free) {
    py::gil_scoped_acquire gil;
    try {
      (*holder)(device, requested, total - free, free);
    } catch (py::error_already_set& e) {
      // The OOM error itself is what the user must see; report the observer failure alongside.
      PyErr_WarnEx(PyExc_RuntimeWarning,
                   (std::string("npu out-of-memory observer failed: ") + e.what()).c_str(), 1);
    }
  });
}

}  // namespace

void init_bindings(pybind11::module_& m) {
  host_memory::init_bindings(m);  // pinned host memory: the allocator of torch.npu's host_* functions
  auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("_npu_memoryStats", &memory_stats, py::arg("device"));
  m.def("_npu_resetAccumulatedMemoryStats", [](int d) { g_allocator.resetAccumulatedStats(d); });
  m.def("_npu_resetPeakMemoryStats", [](int d) { g_allocator.resetPeakStats(d); });
  m.def("_npu_emptyCache", &empty_cache, nogil);
  m.def("_npu_eraseStream", [](const at::Tensor& tensor, int64_t stream_id, int64_t device_index,
                               int64_t device_type) {
    erase_stream(tensor, c10::Stream::unpack3(stream_id, static_cast<c10::DeviceIndex>(device_index),
                                              static_cast<c10::DeviceType>(device_type)));
  }, py::arg("tensor"), py::arg("stream_id"), py::arg("device_index"), py::arg("device_type"));
  m.def("_npu_memGetInfo", [](int d) { return g_allocator.getMemoryInfo(d); });
  m.def("_npu_setMemoryFraction", [](double f, int d) {
    check_device(d);
    try {
      core()->set_memory_fraction(f, d);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  });
  m.def("_npu_getMemoryFraction", [](int d) {
    check_device(d);
    return core()->memory_fraction(d);
  });
  m.def("_npu_cachingAllocator_raw_alloc", [](size_t size, int d, int64_t stream) {
    check_device(d);
    return reinterpret_cast<uintptr_t>(raw_alloc(size, d, stream));
  }, nogil);
  m.def("_npu_cachingAllocator_raw_delete", [](uintptr_t ptr) {
    try {
      raw_delete(reinterpret_cast<void*>(ptr));
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, "caching_allocator_delete: ", e.what());
    }
  }, nogil);
  m.def("_npu_memorySnapshot", &memory_snapshot);
  m.def("_npu_record_memory_history", &record_memory_history, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"), py::arg("clear_history"), py::arg("skip_actions"));
  m.def("_npu_attach_out_of_memory_observer", &attach_oom_observer);
  m.def("_npu_set_allocator_settings", [](const std::string& conf) {
    try {
      core()->set_config(alloc::parse_allocator_config(conf));
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  });
  m.def("_npu_allocator_settings", &allocator_settings);
  m.def("_npu_cachingAllocator_enable", [](bool on) { core()->set_caching(on); }, nogil);  // may wait for the streams
  m.def("_npu_cachingAllocator_is_enabled", [] { return core()->caching_enabled(); });
  m.def("_npu_change_current_allocator", [](uintptr_t alloc_fn, uintptr_t free_fn) {
    TORCH_CHECK_VALUE(alloc_fn && free_fn, "change_current_allocator: null allocation function");
    TORCH_CHECK(!g_used.load() && !g_plug_alloc.load(),
                "change_current_allocator: can't swap an already initialized allocator; npu memory was "
                "already allocated in this process. Call it before the first npu allocation.");
    g_plug_free.store(reinterpret_cast<PlugFree>(free_fn));
    g_plug_alloc.store(reinterpret_cast<PlugAlloc>(alloc_fn));
  });
  m.def("_npu_new_mempool_id", [] { return py::make_tuple(0, g_next_user_pool.fetch_add(1)); });
  m.def("_npu_mempool_create", &create_pool, py::arg("device"), py::arg("id"), py::arg("alloc_fn"),
        py::arg("free_fn"), py::arg("use_on_oom"), py::arg("no_split"));
  m.def("_npu_beginAllocateCurrentThreadToPool", &begin_allocate_current_thread_to_pool);
  m.def("_npu_endAllocateToPool", [](int d, PoolIdArg id) {
    check_device(d);
    pool_call("use_mem_pool", [&] { core()->end_allocate_to_pool(d, id); });
  });
  m.def("_npu_releasePool", [](int d, PoolIdArg id) {
    check_device(d);
    pool_call("MemPool", [&] { core()->release_pool(d, id); });
  });
  m.def("_npu_getPoolUseCount", [](int d, PoolIdArg id) {
    check_device(d);
    return g_core.load() ? core()->pool_use_count(d, id) : 0;
  });
  m.def("_npu_emptyCachePool", [](PoolIdArg id) {
    launch::release_finished();
    core()->empty_cache(id);
  }, nogil);
  m.def("_npu_empty_with_swapped_memory", &empty_with_swapped_memory);
  m.def("_npu_is_swapped", &is_swapped);
  m.def("_npu_swapped_memory_bytes", [] { return g_swapped_bytes.load(); });
  m.def("_npu_allocator_backend", [] { return g_plug_alloc.load() ? "pluggable" : "native"; });
}

}  // namespace npudist::memory
