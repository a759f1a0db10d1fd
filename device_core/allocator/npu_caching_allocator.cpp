// Torch adapter of the caching allocator core: the c10::DeviceAllocator for PrivateUse1 (npu), OOM ->
// torch.OutOfMemoryError, Python stack capture for snapshots, the pluggable-allocator switch and stream tracking.
// Swapped memory is in swapped_memory.cpp, torch.npu.memory's bindings in npu_allocator_bindings.cpp.
#include "npu_allocator.h"
#include "npu_allocator_internal.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/extension.h>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "caching_allocator.h"
#include "launch/launch.h"
#include "npu_runtime.h"
#include "npu_tensor.h"
#include "profiler/profiler.h"

// Exported by libtorch_python (torch/csrc/profiler/python/combined_traceback.h, whose header needs
// nlohmann/json.hpp, which torch wheels do not ship).
namespace torch {
void installCapturedTracebackPython();
}  // namespace torch

namespace npudist::memory {
namespace {

using alloc::CachingAllocator;
using detail::PlugAlloc;
using detail::PlugFree;
using detail::check_device;
using detail::check_native;
using detail::empty_cache;
using detail::raw_alloc;
using detail::raw_delete;
using detail::stream_handle;

// ---- peak memory under asynchronous launch (docs/memory.md, "Peak memory"). Queued work of another stream can
// hold memory the host has dropped: a collective keeps its tensors until it ran on the group's comm stream, a
// kernel queued on memory outside the pools holds it. In step with the device (blocking launch) that memory
// would be free by now, so an allocation that would raise the peak first lets the device catch up and
// releases what finished kernels held. Only on a thread that launches (never a stream's worker, which would
// wait for itself), only when another stream has queued work (the allocating stream's own queued kernels hold
// nothing the host dropped: stream-ordered reuse), never while capture or a profiler keeps launch
// synchronous. The runtime's drain gives up once no task of the device finished for kPeakWaitStallMs, because
// the queued work may wait for this thread (an ExternalEvent it records later, a host function that needs a
// lock it holds). The bound is on progress, not on the whole wait, and long: a collective on the comm stream
// finishes only when every peer issued it, and with more ranks than cores a peer can be descheduled for a
// few hundred ms; a drain given up there pauses the drains and leaves the peak above blocking launch's
// (BENCHMARKS.md, "Peak memory by launch mode"). After a drain that stalled, the device's next drains are
// skipped for kPeakWaitPause, so a program whose queue waits for its own thread loses at most a tenth of its
// time to them.
constexpr uint32_t kPeakWaitStallMs = 1000;
constexpr auto kPeakWaitPause = std::chrono::seconds(10);
std::atomic<int64_t> g_peak_wait_paused_until[NPUDIST_MAX_DEVICES];

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void catch_up_before_new_peak(int d, int64_t stream) {
  if (!launch::launching_thread() || !launch::may_queue(d)) return;
  launch::release_finished();  // kernels that already ran let go of what they held
  if (rt::api().device_busy_besides(d, stream) != 1 ||
      steady_ns() < g_peak_wait_paused_until[d].load(std::memory_order_relaxed)) {
    return;
  }
  // The runtime's blocking hooks release the GIL while it waits: host functions on the streams may need it.
  if (rt::api().device_drain(d, kPeakWaitStallMs) != 1) {
    g_peak_wait_paused_until[d].store(steady_ns() + std::chrono::nanoseconds(kPeakWaitPause).count(),
                                      std::memory_order_relaxed);
  }
  launch::release_finished();
}

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
  void before_new_peak(int d, int64_t stream) override { catch_up_before_new_peak(d, stream); }
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

CachingAllocator* make_core() {
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
struct PlugInfo {
  size_t size;
  int device;
  int64_t stream;
};
std::atomic<PlugAlloc> g_plug_alloc{nullptr};
std::atomic<PlugFree> g_plug_free{nullptr};
std::mutex g_plug_mu;
std::unordered_map<void*, PlugInfo> g_plug_live;

// ---- the deallocation hook (the stream sanitizer, npudist/device/sync_trace.py): a Python callable called as
// hook(data_ptr, stream_id) before a block goes back to its stream's pool. Replaced only with the GIL held, so a
// caller holding the GIL sees a stable value; the free path reads it relaxed first, which costs nothing while no
// hook is set (the sanitizer off).
std::atomic<PyObject*> g_free_hook{nullptr};

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// The stream whose pool the live block at `ptr` returns to; -1 for memory that is not a live block.
int64_t stream_of_live(void* ptr) {
  if (g_plug_free.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_plug_mu);
    if (auto it = g_plug_live.find(ptr); it != g_plug_live.end()) return it->second.stream;
  }
  CachingAllocator* c = g_core.load(std::memory_order_acquire);
  return c ? c->stream_of(ptr) : -1;
}

// Called before the block is freed, outside every allocator lock (stream_of_live takes and drops its own). Frees
// come from any thread, also during interpreter shutdown: once Python finalizes, the hook is not called (taking
// the GIL then would block a non-main thread forever). A Python exception set on this thread (a tensor freed while
// one propagates) is kept across the call; the hook's own errors are reported as unraisable, never thrown from a
// deleter.
void call_free_hook(void* ptr) {
  const int64_t stream = stream_of_live(ptr);
  if (stream < 0 || !Py_IsInitialized() || python_finalizing()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (PyObject* hook = g_free_hook.load(std::memory_order_acquire)) {
    Py_INCREF(hook);  // the hook may be replaced while it runs
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    PyErr_Fetch(&type, &value, &tb);
    PyObject* r = PyObject_CallFunction(hook, "KL", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ptr)),
                                        static_cast<long long>(stream));
    if (r) {
      Py_DECREF(r);
    } else {
      PyErr_WriteUnraisable(hook);
    }
    PyErr_Restore(type, value, tb);
    Py_DECREF(hook);
  }
  PyGILState_Release(gil);
}

[[noreturn]] void rethrow_oom(const alloc::OutOfMemoryError& e) {
  TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
}

}  // namespace

namespace detail {

CachingAllocator* core() { return make_core(); }
bool core_created() { return g_core.load(std::memory_order_acquire) != nullptr; }
void mark_used() { g_used.store(true); }
bool used() { return g_used.load(); }

void set_context_capture(int level, bool cpp) {
  if (level > 0) torch::installCapturedTracebackPython();
  g_context_cpp.store(cpp);
  g_context_level.store(level);
}

void* stream_handle(int64_t id) { return reinterpret_cast<void*>(static_cast<intptr_t>(id)); }
bool pluggable_active() { return g_plug_alloc.load() != nullptr; }

void change_current_allocator(PlugAlloc alloc_fn, PlugFree free_fn) {
  TORCH_CHECK_VALUE(alloc_fn && free_fn, "change_current_allocator: null allocation function");
  TORCH_CHECK(!g_used.load() && !g_plug_alloc.load(),
              "change_current_allocator: can't swap an already initialized allocator; npu memory was "
              "already allocated in this process. Call it before the first npu allocation.");
  g_plug_free.store(free_fn);
  g_plug_alloc.store(alloc_fn);
}

void set_free_hook(PyObject* hook) {
  Py_XINCREF(hook);
  PyObject* old = g_free_hook.exchange(hook, std::memory_order_acq_rel);
  Py_XDECREF(old);
}

PyObject* free_hook() { return g_free_hook.load(std::memory_order_acquire); }

void raw_delete(void* ptr) {
  profiler::report_free(ptr);
  if (ptr && g_free_hook.load(std::memory_order_relaxed)) call_free_hook(ptr);
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
  detail::core()->free(ptr, gather_context(3));
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
      return detail::core()->malloc(dev, n, stream, ctx);
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
  detail::core()->empty_cache();
}

void check_native(const char* what) {
  TORCH_CHECK(!g_plug_alloc.load(), what, " is not available while a pluggable allocator "
              "(torch.npu.memory.change_current_allocator) is active; it reports the caching allocator");
}

void check_device(int d) {
  TORCH_CHECK_VALUE(d >= 0 && d < rt::device_count(), "invalid npu device index ", d, " (there are ",
                    rt::device_count(), " visible npu devices)");
}

}  // namespace detail

namespace {

using detail::core;

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

bool order_reuse_after(const c10::DataPtr& data_ptr, int64_t stream) {
  if (!data_ptr.get() || data_ptr.get_deleter() != &raw_delete) return false;
  CachingAllocator* c = core();
  if (!c->caching_enabled()) return false;
  if (g_plug_free.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_plug_mu);
    if (g_plug_live.count(data_ptr.get())) return false;
  }
  const int64_t owner = c->stream_of(data_ptr.get());
  if (owner < 0) return false;
  if (owner != stream) c->record_stream(data_ptr.get(), stream);  // the caller holds the storage: still live
  return true;
}

void record_stream(const c10::DataPtr& data_ptr, c10::Stream stream) {
  if (tracks_streams(data_ptr, stream, "record_stream")) core()->record_stream(data_ptr.get(), stream.id());
}

// torch_npu.erase_stream: undoes record_stream(stream) once the caller made the tensor's stream wait for it.
void detail::erase_stream(const at::Tensor& tensor, c10::Stream stream) {
  TORCH_CHECK_VALUE(tensor.device().type() == c10::DeviceType::PrivateUse1,
                    "erase_stream: expected an npu tensor, got a tensor on ", tensor.device());
  TORCH_CHECK_VALUE(stream.device_index() == tensor.device().index(), "erase_stream: the stream is on npu:",
                    static_cast<int>(stream.device_index()), " and the tensor on ", tensor.device(),
                    "; pass a stream of the tensor's device");
  const c10::DataPtr& data_ptr = tensor.storage().data_ptr();
  if (tracks_streams(data_ptr, stream, "erase_stream")) core()->erase_stream(data_ptr.get(), stream.id());
}

}  // namespace npudist::memory
