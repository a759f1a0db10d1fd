// Asynchronous kernel launch: kernels as host functions on the runtime's per-stream queues, errors
// carried to the next synchronization point, the worker's thread-local state taken from the launcher.
#include "launch/launch.h"
#include "launch/launch_state.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <unordered_map>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include <pthread.h>

#include "npu_runtime.h"

namespace npudist::launch {
namespace {

bool env_true(const char* name) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
}

SiteHooks g_site;  // set once at module import, before any op
std::atomic<uint64_t> g_queued{0}, g_sync{0}, g_meta{0}, g_inline{0};

// The first kernel failure since the last report (CUDA reports the first asynchronous error too).
std::atomic<bool> g_has_error{false};
std::mutex g_error_mu;
std::string g_error;

void record_message(std::string message) {
  std::lock_guard<std::mutex> lk(g_error_mu);
  if (g_has_error.load()) return;
  g_error = std::move(message);
  g_has_error.store(true);
}

void record_error(const std::string& op, const std::string& site, const char* what) {
  record_message("npu kernel " + op + " (launched at " + (site.empty() ? std::string("<unknown>") : site) +
                 ") failed asynchronously: " + what +
                 "\n(npu kernels run asynchronously; set ASCEND_LAUNCH_BLOCKING=1 to raise at the call)");
}

// The launch window of one stream: how many kernels are queued there and not yet run. Only the count is bounded
// (queue_depth(), a device launch queue's length): queued kernels hold no memory the host could otherwise reuse,
// since a block the host frees returns to its stream's pool at once (docs/memory.md, "Stream-ordered reuse"), so
// the host runs as far ahead as a device's queue lets it, whatever the kernels' kind. A launch into a full window
// waits until half of it ran.
constexpr int kDefaultQueueDepth = 1024;
// Small kernels faster than this on the launching thread run inline on an idle stream (launch.h,
// inline_kernel_ns): about what a hand-off to the worker costs the host here (1-4 us; BENCHMARKS.md,
// "Asynchronous launch", a queued 64x64 add against the same add inline).
constexpr int64_t kDefaultInlineNs = 2000;
// How much longer than the queued kernels' learnt times an inline launch waits for its stream to go idle:
// the kernel running may have started a little earlier or run a little slower than its samples.
constexpr int64_t kInlineWaitSlackNs = 20000;

struct Window {
  std::atomic<int> inflight{0};
  std::atomic<int> not_inline{0};       // queued kernels that would not run inline (LaunchCost::inline_ns < 0)
  std::atomic<int64_t> inline_ns{0};    // the learnt CPU times of the others, summed
  std::atomic<int> waiters{0};
  std::mutex mu;
  std::condition_variable cv;

  bool admits() const {
    const int depth = queue_depth();
    return depth <= 0 || inflight.load(std::memory_order_acquire) < depth;
  }
  bool half_drained() const {
    const int depth = queue_depth();
    return depth <= 0 || inflight.load(std::memory_order_acquire) <= depth / 2;
  }
};

Window* window_for(int device, int64_t stream) {
  thread_local int last_device = -1;
  thread_local int64_t last_stream = -1;
  thread_local Window* last = nullptr;
  if (device == last_device && stream == last_stream) return last;
  static std::mutex mu;
  static auto* windows = new std::unordered_map<int64_t, Window*>();  // never freed: workers may outlive statics
  Window* w;
  {
    std::lock_guard<std::mutex> lk(mu);
    Window*& slot = (*windows)[(static_cast<int64_t>(device) << 32) ^ stream];
    if (!slot) slot = new Window();
    w = slot;
  }
  last_device = device;
  last_stream = stream;
  last = w;
  return w;
}

// Wait (Python GIL released) until half of the window ran.
void wait_half_drained(Window* w) {
  for (int i = 0; i < 64; ++i) {
    if (w->half_drained()) return;
    std::this_thread::yield();
  }
  void* token = g_site.block_begin ? g_site.block_begin() : nullptr;
  w->waiters.fetch_add(1);
  {
    std::unique_lock<std::mutex> lk(w->mu);
    while (!w->half_drained()) w->cv.wait_for(lk, std::chrono::milliseconds(1));
  }
  w->waiters.fetch_sub(1);
  if (g_site.block_end) g_site.block_end(token);
}

// What a kernel needs from its launching thread: the kernel and the state it runs under (launch_state.h);
// intra-op threads come from ATen's setting, initialised once per worker.
struct QueuedKernel {
  QueuedKernel(std::function<void()> k, const char* o) : kernel(std::move(k)), op(o) {}
  ~QueuedKernel() {
    if (site && g_site.release) g_site.release(site);
  }
  std::function<void()> kernel;
  const char* op;
  void* site = nullptr;  // launch-site token (SiteHooks)
  Window* window = nullptr;
  int device = -1;
  LaunchCost cost;
  LaunchState state = capture_launch_state();
};

// Kernels that ran, waiting for a launching thread to destroy them (release_finished). Why not destroy them
// on the worker: nearly everything a task holds (the task, its closure, the CPU aliases of the arguments,
// their storages) was allocated by the launching thread, and glibc returns a block freed by another thread
// to the allocating thread's arena under that arena's lock. The worker freeing while the host allocated
// made both wait on that lock on every op; freed where they were allocated, the blocks go back through the
// thread's own cache (BENCHMARKS.md, per-op launch cost). Heap-allocated and replaced after fork: a worker
// of the parent may have held the mutex.
struct Retired {
  std::mutex mu;
  std::vector<QueuedKernel*> tasks;
};
std::atomic<Retired*> g_retired{new Retired()};
std::atomic<bool> g_has_retired{false};

// Warnings raised by queued kernels on a worker (a kernel whose signature warned on its synchronous first call
// is never queued, so these are the data-dependent ones). The worker's C++ warning handler has no Python caller
// to report to: they are carried to the launching side and raised there, in order, at the next launch or
// synchronization point, as asynchronous errors are. Bounded: a runaway kernel loop cannot grow it unbounded.
struct QueuedWarnings {
  static constexpr size_t kMax = 1024;
  std::mutex mu;
  std::vector<c10::Warning> list;
  size_t dropped = 0;
};
std::atomic<QueuedWarnings*> g_warnings{new QueuedWarnings()};
std::atomic<bool> g_has_warnings{false};

class WorkerWarningHandler final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    QueuedWarnings* q = g_warnings.load(std::memory_order_acquire);
    std::lock_guard<std::mutex> lk(q->mu);
    if (q->list.size() < QueuedWarnings::kMax) q->list.push_back(warning);
    else ++q->dropped;
    g_has_warnings.store(true, std::memory_order_release);
  }
};

void forget_retired_after_fork() {
  g_retired.store(new Retired());  // the parent's tasks are leaked: their memory belongs to the parent's state
  g_has_retired.store(false);
  g_warnings.store(new QueuedWarnings());
  g_has_warnings.store(false);
}

struct RetiredForkHandler {
  RetiredForkHandler() { pthread_atfork(nullptr, nullptr, &forget_retired_after_fork); }
} g_retired_fork_handler;

void retire(QueuedKernel* t) {
  Retired* r = g_retired.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> lk(r->mu);
  r->tasks.push_back(t);
  g_has_retired.store(true, std::memory_order_release);
}

void run_task(void* arg) {
  std::unique_ptr<QueuedKernel> t(static_cast<QueuedKernel*>(arg));
  static thread_local bool threads_initialised = false;
  if (!threads_initialised) {
    at::init_num_threads();
    static thread_local WorkerWarningHandler warnings;
    c10::WarningUtils::set_warning_handler(&warnings);
    threads_initialised = true;
  }
  try {
    WorkerStateScope state(t->state);
    BusyScope busy(t->device);
    t->kernel();
  } catch (const std::exception& e) {
    record_error(t->op, t->site && g_site.describe ? g_site.describe(t->site) : std::string(), e.what());
  } catch (...) {
    record_error(t->op, t->site && g_site.describe ? g_site.describe(t->site) : std::string(), "unknown exception");
  }
  Window* w = t->window;
  const LaunchCost cost = t->cost;
  retire(t.release());  // its captured tensors are released by the next launch or synchronization on the host
  if (cost.inline_ns < 0) w->not_inline.fetch_sub(1, std::memory_order_acq_rel);
  else w->inline_ns.fetch_sub(cost.inline_ns, std::memory_order_acq_rel);
  w->inflight.fetch_sub(1, std::memory_order_acq_rel);
  if (w->waiters.load(std::memory_order_acquire) > 0 && w->half_drained()) {
    std::lock_guard<std::mutex> lk(w->mu);
    w->cv.notify_all();
  }
}

}  // namespace

// Asynchronous launch is the default, as on CUDA and Ascend. NPUDIST_LAUNCH_BLOCKING wins over
// ASCEND_LAUNCH_BLOCKING; "0" (or empty) selects asynchronous launch, anything else blocking.
namespace {

thread_local int t_inline = 0;  // set_thread_inline of the C table, per thread

bool env_blocking() {
  static const bool value = [] {
    for (const char* name : {"NPUDIST_LAUNCH_BLOCKING", "ASCEND_LAUNCH_BLOCKING"}) {
      if (std::getenv(name)) return env_true(name);
    }
    return false;
  }();
  return value;
}

// torch_npu's task-queue level (TASK_QUEUE_ENABLE, then torch.npu.set_task_queue_enable): 0 launches every op
// synchronously, as blocking launch does; 1 and 2 queue. Level 2 changes how torch_npu's own two-stage queue
// hands work over, which the emulated device does not have: it queues exactly as 1 and is reported back.
// -1 until first read. npudist/env.py has checked the variable before the extension loads.
std::atomic<int> g_task_queue_level{-1};

int read_task_queue_level() {
  int level = g_task_queue_level.load(std::memory_order_relaxed);
  if (level >= 0) return level;
  const char* v = std::getenv("TASK_QUEUE_ENABLE");
  level = (v && v[0] == '0' && v[1] == '\0') ? 0 : (v && v[0] == '2' && v[1] == '\0') ? 2 : 1;
  int unset = -1;
  g_task_queue_level.compare_exchange_strong(unset, level);
  return g_task_queue_level.load(std::memory_order_relaxed);
}

int set_thread_inline(int enable) {
  int previous = t_inline;
  t_inline = enable;
  return previous;
}

int launches_async() { return blocking() ? 0 : 1; }

void record_async_error(const char* message) { record_message(message ? message : "unknown asynchronous error"); }

const NpudistLaunchApi g_c_api{NPUDIST_LAUNCH_API_VERSION, &set_thread_inline, &launches_async,
                               &record_async_error};

}  // namespace

bool blocking() { return t_inline != 0 || env_blocking() || read_task_queue_level() == 0; }

std::atomic<int> g_synchronous_holds{0};

bool may_queue(int device) {
  if (g_synchronous_holds.load(std::memory_order_relaxed) != 0 || blocking()) return false;
  return !is_sync_launch_stream(rt::api().get_stream(device < 0 ? rt::current_device() : device));
}

bool is_sync_launch_stream(int64_t stream) {
  return stream >= NPUDIST_SYNC_LAUNCH_STREAM_FIRST &&
         stream < NPUDIST_SYNC_LAUNCH_STREAM_FIRST + NPUDIST_SYNC_LAUNCH_STREAMS;
}

int64_t sync_launch_stream(int device) {
  rt::check_device(device);
  static std::atomic<uint32_t> next[NPUDIST_MAX_DEVICES];
  return NPUDIST_SYNC_LAUNCH_STREAM_FIRST + next[device].fetch_add(1, std::memory_order_relaxed) %
                                                NPUDIST_SYNC_LAUNCH_STREAMS;
}

void hold_synchronous(int delta) { g_synchronous_holds.fetch_add(delta, std::memory_order_relaxed); }

int task_queue_level() { return env_blocking() ? 0 : read_task_queue_level(); }

void set_task_queue_level(int level) {
  TORCH_CHECK_VALUE(level >= 0 && level <= 2, "set_task_queue_enable: mode must be 0, 1 or 2, got ", level);
  g_task_queue_level.store(level, std::memory_order_relaxed);
}

const NpudistLaunchApi* c_api() { return &g_c_api; }

int queue_depth() {
  static const int value = [] {
    const char* v = std::getenv("NPUDIST_LAUNCH_QUEUE_DEPTH");
    if (!v || !*v) return kDefaultQueueDepth;
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    TORCH_CHECK_VALUE(end && *end == '\0' && n >= 0 && n <= (1 << 20), "NPUDIST_LAUNCH_QUEUE_DEPTH='", v,
                      "' is not a queue depth; use a number of kernels >= 0 (0: unbounded)");
    return static_cast<int>(n);
  }();
  return value;
}

int64_t inline_kernel_ns() {
  static const int64_t value = [] {
    const char* v = std::getenv("NPUDIST_LAUNCH_INLINE_NS");
    if (!v || !*v) return kDefaultInlineNs;
    char* end = nullptr;
    long long n = std::strtoll(v, &end, 10);
    TORCH_CHECK_VALUE(end && *end == '\0' && n >= 0 && n <= 1000000000LL, "NPUDIST_LAUNCH_INLINE_NS='", v,
                      "' is not a kernel time; use nanoseconds >= 0 (0: always queue)");
    return static_cast<int64_t>(n);
  }();
  return value;
}

namespace {

// Whether `device`'s current stream is idle, or becomes so within the learnt time of the candidates queued there.
bool idle_for_inline(int device) {
  const int64_t stream = rt::api().get_stream(device);
  auto idle = [&] { return rt::api().stream_query(device, stream) == 1; };
  if (idle()) return true;
  Window* w = window_for(device, stream);
  if (w->not_inline.load(std::memory_order_acquire) > 0) return false;
  for (int i = 0; i < 64; ++i) {
    if (idle()) return true;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  // The stream may also hold work that is not a kernel (an event wait, a collective, an extension's host
  // function): the wait is bounded by what the queued kernels should take, and then the kernel is queued.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::nanoseconds(w->inline_ns.load(std::memory_order_acquire) + kInlineWaitSlackNs);
  void* token = g_site.block_begin ? g_site.block_begin() : nullptr;
  bool done;
  while (!(done = idle()) && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  if (g_site.block_end) g_site.block_end(token);
  return done;
}

}  // namespace

bool take_inline(int device, bool candidate) {
  if (!candidate || !idle_for_inline(device)) return false;
  count_inline();
  release_finished();
  raise_queued_warnings();
  return true;
}

bool release_finished() {
  if (!g_has_retired.load(std::memory_order_acquire)) return false;
  thread_local std::vector<QueuedKernel*> done;  // keeps its capacity: swapped with the shared list each time
  thread_local bool releasing = false;   // a destructor below that reached a launch must not swap `done` again
  if (releasing) return false;
  releasing = true;
  {
    Retired* r = g_retired.load(std::memory_order_acquire);
    std::lock_guard<std::mutex> lk(r->mu);
    done.swap(r->tasks);
    g_has_retired.store(false, std::memory_order_release);
  }
  const bool any = !done.empty();
  for (QueuedKernel* t : done) delete t;
  done.clear();
  releasing = false;
  return any;
}

void raise_queued_warnings() {
  if (!g_has_warnings.load(std::memory_order_acquire)) return;
  std::vector<c10::Warning> list;
  size_t dropped;
  {
    QueuedWarnings* q = g_warnings.load(std::memory_order_acquire);
    std::lock_guard<std::mutex> lk(q->mu);
    list.swap(q->list);
    dropped = q->dropped;
    q->dropped = 0;
    g_has_warnings.store(false, std::memory_order_release);
  }
  for (const c10::Warning& w : list) c10::warn(w);
  if (dropped) TORCH_WARN(dropped, " more warnings of queued npu kernels were dropped");
}

namespace {
thread_local bool t_launched = false;
}  // namespace

bool launching_thread() { return t_launched; }

void enqueue(int device, const char* op, std::function<void()> kernel, LaunchCost cost) {
  t_launched = true;
  release_finished();
  raise_queued_warnings();
  int64_t stream = rt::api().get_stream(device);
  if (is_sync_launch_stream(stream)) {  // no task queue: run here, after the stream's queued work (drain)
    drain(device);
    BusyScope busy(device);
    kernel();
    return;
  }
  auto task = std::make_unique<QueuedKernel>(std::move(kernel), op);
  if (g_site.capture) task->site = g_site.capture();
  Window* w = window_for(device, stream);
  if (!w->admits()) wait_half_drained(w);
  task->window = w;
  task->device = device;
  task->cost = cost;
  auto add = [&](int sign) {
    w->inflight.fetch_add(sign, std::memory_order_acq_rel);
    if (cost.inline_ns < 0) w->not_inline.fetch_add(sign, std::memory_order_acq_rel);
    else w->inline_ns.fetch_add(sign * cost.inline_ns, std::memory_order_acq_rel);
  };
  add(1);
  const npudist_status st = rt::api().launch_host_func(device, stream, &run_task, task.get());
  if (st != NPUDIST_SUCCESS) add(-1);
  rt::check(st);
  task.release();
  g_queued.fetch_add(1, std::memory_order_relaxed);
}

void drain(int device) {
  if (blocking()) return;
  int64_t stream = rt::api().get_stream(device);
  if (rt::api().stream_query(device, stream) == 0) rt::check(rt::api().stream_synchronize(device, stream));
  after_sync();
}

void after_sync() {
  release_finished();
  raise_queued_warnings();
  raise_pending_error();
}

void raise_pending_error() {
  if (!g_has_error.load(std::memory_order_acquire)) return;
  std::string msg;
  {
    std::lock_guard<std::mutex> lk(g_error_mu);
    msg.swap(g_error);
    g_has_error.store(false);
  }
  TORCH_CHECK(false, msg);
}

void set_site_hooks(SiteHooks hooks) { g_site = hooks; }

Counts counts() { return Counts{g_queued.load(), g_sync.load(), g_meta.load(), g_inline.load()}; }
void reset_counts() {
  g_inline.store(0);
  g_queued.store(0);
  g_sync.store(0);
  g_meta.store(0);
}
void count_synchronous() { g_sync.fetch_add(1, std::memory_order_relaxed); }
void count_metadata() { g_meta.fetch_add(1, std::memory_order_relaxed); }
void count_inline() { g_inline.fetch_add(1, std::memory_order_relaxed); }

}  // namespace npudist::launch

// Exported (the extension is built -fvisibility=hidden), like npudist_runtime_api, for the emulated
// libascendcl.so (npudist/cann): under blocking launch its stream calls complete before they return.
extern "C" __attribute__((visibility("default"))) const NpudistLaunchApi* npudist_launch_api(void) {
  return npudist::launch::c_api();
}
