// The emulated NPU runtime (torch-free): device configuration from the environment, the thread's current
// device and streams, per-stream host-function queues run by lazily started worker threads, markers
// (the substance of events). The C table over all of it is runtime_c_api.cpp.
//
// A stream holds host functions: the aten glue's queued kernels (device_core/launch/launch.cpp) and other
// components' work (hccl). A stream's worker runs them in order; a marker recorded on a stream is done
// once everything enqueued before it has run; a stream-wait task holds a stream's worker until another
// stream's marker is done (cudaStreamWaitEvent). Waits spin briefly, then yield, then sleep (the machine has fewer cores than the
// threads that wait), and every sleep is bounded so a lost wake-up costs at most a millisecond.
#include "runtime/runtime_internal.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace npudist::runtime {

// ---------------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------------
namespace {

constexpr int kMaxPhysical = kMaxDevices;
constexpr size_t kDefaultCapacity = size_t(16) << 30;

struct Config {
  std::vector<int> physical;  // visible index -> physical index
  size_t capacity = kDefaultCapacity;
};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n"), e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

int parse_int(const std::string& raw, const char* var) {
  std::string s = trim(raw);
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0) {
    throw std::invalid_argument(std::string(var) + "='" + raw + "' is not an integer");
  }
  return static_cast<int>(v);
}

Config load_config() {
  Config c;
  int n = 8;
  if (const char* v = std::getenv("NPUDIST_DEVICE_COUNT")) {
    n = parse_int(v, "NPUDIST_DEVICE_COUNT");
    if (n < 0 || n > kMaxPhysical) {
      throw std::invalid_argument("NPUDIST_DEVICE_COUNT=" + std::string(v) + " is out of range: use 0.." +
                                  std::to_string(kMaxPhysical));
    }
  }
  if (const char* v = std::getenv("ASCEND_RT_VISIBLE_DEVICES")) {
    std::string s = v;
    size_t pos = 0;
    while (!trim(s).empty() && pos <= s.size()) {
      size_t comma = s.find(',', pos);
      std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      int id = parse_int(item, "ASCEND_RT_VISIBLE_DEVICES");
      if (id < 0 || id >= n) {
        throw std::invalid_argument("ASCEND_RT_VISIBLE_DEVICES='" + s + "' names device " + std::to_string(id) +
                                    ", but only devices 0.." + std::to_string(n - 1) +
                                    " exist (NPUDIST_DEVICE_COUNT=" + std::to_string(n) + ")");
      }
      for (int p : c.physical) {
        if (p == id) {
          throw std::invalid_argument("ASCEND_RT_VISIBLE_DEVICES='" + s + "' lists device " +
                                      std::to_string(id) + " twice");
        }
      }
      c.physical.push_back(id);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  } else {
    for (int i = 0; i < n; ++i) c.physical.push_back(i);
  }
  if (const char* v = std::getenv("NPUDIST_DEVICE_MEMORY")) {
    c.capacity = parse_size(v, "NPUDIST_DEVICE_MEMORY");
  }
  return c;
}

const Config& config() {
  static const Config c = load_config();
  return c;
}

}  // namespace

size_t parse_size(const std::string& raw, const char* var) {
  std::string s = trim(raw);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string num = s.substr(0, i), unit = trim(s.substr(i));
  char* end = nullptr;
  double v = num.empty() ? -1 : std::strtod(num.c_str(), &end);
  static const struct { const char* name; double mult; } kUnits[] = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1024.0 * 1024}, {"GiB", 1024.0 * 1024 * 1024},
      {"TiB", 1024.0 * 1024 * 1024 * 1024}, {"K", 1024.0}, {"M", 1024.0 * 1024}, {"G", 1024.0 * 1024 * 1024}};
  double mult = -1;
  for (const auto& u : kUnits) {
    if (unit == u.name) mult = u.mult;
  }
  if (num.empty() || (end && *end != '\0') || mult < 0 || !(v > 0) || !std::isfinite(v * mult)) {
    throw std::invalid_argument(std::string(var) + "='" + raw +
                                "' is not a positive size: use e.g. 16GiB, 512MiB, 1GB or a byte count");
  }
  return static_cast<size_t>(v * mult);
}

void validate_config() { (void)config(); }

int device_count() {
  try {
    return static_cast<int>(config().physical.size());
  } catch (const std::exception&) {
    return 0;  // callers that must not throw (guard deviceCount) see no devices; import reports the error
  }
}

int physical_device(int device) {
  check_device(device);
  return config().physical[device];
}

size_t device_capacity(int device) {
  check_device(device);
  return config().capacity;
}

void check_device(int device) {
  int n = device_count();
  if (device < 0 || device >= n) {
    throw std::out_of_range("Invalid npu device index " + std::to_string(device) + ": this process sees " +
                            std::to_string(n) + " npu device(s) (NPUDIST_DEVICE_COUNT, ASCEND_RT_VISIBLE_DEVICES)");
  }
}

// ---------------------------------------------------------------------------------------------------
// Current device and streams (thread-local, like cudaSetDevice / the current CUDA stream)
// ---------------------------------------------------------------------------------------------------
namespace {
thread_local int tls_device = 0;
thread_local int64_t tls_stream[kMaxDevices] = {};
std::atomic<bool> g_initialized{false};
}  // namespace

int current_device() { return tls_device; }

void set_current_device(int device) {
  check_device(device);
  tls_device = device;
  g_initialized.store(true, std::memory_order_relaxed);
}

int64_t current_stream(int device) { return tls_stream[device]; }

void set_current_stream(int device, int64_t stream) {
  check_device(device);
  check_stream(stream);
  tls_stream[device] = stream;
}

bool is_initialized() { return g_initialized.load(std::memory_order_relaxed); }
void mark_initialized() {
  if (!g_initialized.load(std::memory_order_relaxed)) g_initialized.store(true, std::memory_order_relaxed);
}

void check_stream(int64_t stream) {
  if (stream < 0 || stream >= kStreamIds) {
    throw std::out_of_range("Invalid npu stream id " + std::to_string(stream) + " (valid: 0.." +
                            std::to_string(kStreamIds - 1) + ")");
  }
}

int64_t pool_stream(int device, bool high_priority) {
  // Like CUDA: streams come round-robin from a fixed pool per priority, so creating streams in a loop
  // cannot exhaust anything. ids 1..kPoolSize are low priority, kPoolSize+1..2*kPoolSize high.
  static std::atomic<uint32_t> next[kMaxDevices][2];
  check_device(device);
  uint32_t i = next[device][high_priority ? 1 : 0].fetch_add(1, std::memory_order_relaxed) % kPoolSize;
  return 1 + static_cast<int64_t>(i) + (high_priority ? kPoolSize : 0);
}

// The sync-launch pool has one priority (torch_npu: getNPUStreamFromSyncLaunchPool takes none).
int stream_priority(int64_t stream) { return stream > kPoolSize && stream < kStreamsPerDevice ? -1 : 0; }

// ---------------------------------------------------------------------------------------------------
// Waiting: spin briefly -> yield -> bounded sleep
// ---------------------------------------------------------------------------------------------------
namespace {

// The spin is short on purpose: a stream worker waits here whenever its queue runs empty, and ranks usually
// outnumber cores here (4 ranks on 2 cores in the quick-start job). A long spin (2000 pauses, 50 yields)
// made that job about a quarter slower than a short one, which lost nothing measurable on 1 rank.
template <class Pred>
void wait_until(Pred done, std::mutex& mu, std::condition_variable& cv, std::atomic<int>& sleepers) {
  for (int i = 0; i < 100; ++i) {
    if (done()) return;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  for (int i = 0; i < 5; ++i) {
    if (done()) return;
    sched_yield();
  }
  sleepers.fetch_add(1);
  {
    std::unique_lock<std::mutex> lk(mu);
    while (!done()) cv.wait_for(lk, std::chrono::milliseconds(1));
  }
  sleepers.fetch_sub(1);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct Marker {
  std::atomic<bool> done{false};
  std::atomic<int64_t> time_ns{0};
  int device = 0;
  int64_t stream = 0;
};

namespace {

struct StreamItem {
  npudist_host_fn fn = nullptr;
  void* arg = nullptr;
  MarkerPtr marker;  // set for marker tasks (fn == nullptr)
  MarkerPtr wait;    // set for stream-wait tasks: the worker blocks until this marker of another stream is done
};

// One stream: an in-order queue of host functions and the worker that runs them.
struct StreamState {
  std::mutex mu;
  std::condition_variable cv_work;  // worker sleeps here
  std::condition_variable cv_done;  // waiters sleep here
  std::deque<StreamItem> queue;
  std::atomic<int64_t> pending{0};  // enqueued and not yet finished
  std::atomic<uint64_t> finished{0};  // run so far: the stream's progress (device_drain); written by its worker only
  std::atomic<int> waiters{0};
  std::atomic<int> worker_sleeping{0};
  bool worker_started = false;

  void run_worker() {
    for (;;) {
      StreamItem t;
      auto has_work = [this] { return pending.load(std::memory_order_acquire) > 0; };
      wait_until(has_work, mu, cv_work, worker_sleeping);
      {
        std::lock_guard<std::mutex> lk(mu);
        if (queue.empty()) continue;  // a fork reset the queue
        t = std::move(queue.front());
        queue.pop_front();
      }
      if (t.wait) wait_on_worker(t.wait);
      if (t.fn) t.fn(t.arg);
      if (t.marker) {
        t.marker->time_ns.store(now_ns(), std::memory_order_relaxed);
        t.marker->done.store(true, std::memory_order_release);
      }
      pending.fetch_sub(1, std::memory_order_acq_rel);
      finished.store(finished.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      if (waiters.load() > 0) {
        std::lock_guard<std::mutex> lk(mu);
        cv_done.notify_all();
      }
    }
  }

  // Defined below state(): a stream's worker waiting for another stream's marker (never calls the blocking
  // hooks: a worker holds no Python GIL).
  static void wait_on_worker(const MarkerPtr& m);

  void push(StreamItem t) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!worker_started) {
        worker_started = true;
        std::thread([this] { run_worker(); }).detach();
      }
      queue.push_back(std::move(t));
      pending.fetch_add(1, std::memory_order_release);
    }
    if (worker_sleeping.load() > 0) {
      std::lock_guard<std::mutex> lk(mu);
      cv_work.notify_one();
    }
  }
};

// Streams are never destroyed: detached workers may still reference them at interpreter exit.
std::atomic<StreamState*> g_streams[kMaxDevices][kStreamIds];

StreamState* state_if_exists(int device, int64_t stream) {
  check_device(device);
  check_stream(stream);
  return g_streams[device][stream].load(std::memory_order_acquire);
}

StreamState* state(int device, int64_t stream) {
  StreamState* s = state_if_exists(device, stream);
  if (s) return s;
  auto* fresh = new StreamState();
  if (g_streams[device][stream].compare_exchange_strong(s, fresh)) return fresh;
  delete fresh;
  return s;
}

void StreamState::wait_on_worker(const MarkerPtr& m) {
  if (m->done.load(std::memory_order_acquire)) return;
  StreamState* other = state(m->device, m->stream);
  other->waiters.fetch_add(1);
  std::atomic<int> sleepers{0};
  wait_until([&] { return m->done.load(std::memory_order_acquire); }, other->mu, other->cv_done, sleepers);
  other->waiters.fetch_sub(1);
}

// After fork only the forking thread exists in the child: forget the parent's workers and queues.
void reset_after_fork() {
  for (auto& dev : g_streams) {
    for (auto& slot : dev) {
      if (slot.load()) slot.store(nullptr);  // leak the parent's state: its mutexes may be held
    }
  }
}

struct ForkHandler {
  ForkHandler() { pthread_atfork(nullptr, nullptr, &reset_after_fork); }
} g_fork_handler;

}  // namespace

MarkerPtr record_marker(int device, int64_t stream) {
  auto m = std::make_shared<Marker>();
  m->device = device;
  m->stream = stream;
  StreamState* s = state_if_exists(device, stream);
  if (!s || s->pending.load(std::memory_order_acquire) == 0) {
    m->time_ns.store(now_ns(), std::memory_order_relaxed);
    m->done.store(true, std::memory_order_release);
    return m;
  }
  StreamItem t;
  t.marker = m;
  s->push(std::move(t));
  return m;
}

bool marker_done(const MarkerPtr& m) { return !m || m->done.load(std::memory_order_acquire); }

namespace {
BlockingHooks g_blocking_hooks;
}

void set_blocking_hooks(BlockingHooks hooks) { g_blocking_hooks = hooks; }

void marker_wait(const MarkerPtr& m) {
  if (marker_done(m)) return;
  StreamState* s = state(m->device, m->stream);
  // Let host functions that need the caller's resources (e.g. the Python GIL) make progress.
  void* token = g_blocking_hooks.before ? g_blocking_hooks.before() : nullptr;
  s->waiters.fetch_add(1);
  std::atomic<int> sleepers{0};
  wait_until([&] { return marker_done(m); }, s->mu, s->cv_done, sleepers);
  s->waiters.fetch_sub(1);
  if (g_blocking_hooks.after) g_blocking_hooks.after(token);
}

double marker_elapsed_ms(const MarkerPtr& start, const MarkerPtr& end) {
  if (!start || !end) throw std::invalid_argument("elapsed_time: both events must have been recorded");
  if (!marker_done(start) || !marker_done(end)) {
    throw std::invalid_argument("elapsed_time: both events must have completed (call synchronize() first)");
  }
  return static_cast<double>(end->time_ns.load() - start->time_ns.load()) / 1e6;
}

void launch_host_func(int device, int64_t stream, void (*fn)(void*), void* arg) {
  if (!fn) throw std::invalid_argument("launch_host_func: fn is null");
  StreamItem t;
  t.fn = fn;
  t.arg = arg;
  state(device, stream)->push(std::move(t));
}

void stream_wait_marker(int device, int64_t stream, const MarkerPtr& m) {
  if (marker_done(m)) return;  // nothing to order after (and a cheap check for the common case)
  StreamItem t;
  t.wait = m;
  state(device, stream)->push(std::move(t));
}

bool stream_query(int device, int64_t stream) {
  StreamState* s = state_if_exists(device, stream);
  return !s || s->pending.load(std::memory_order_acquire) == 0;
}

void stream_synchronize(int device, int64_t stream) {
  if (stream_query(device, stream)) return;
  marker_wait(record_marker(device, stream));
}

// The device-wide questions read every existing stream's own counters: they are asked rarely (an allocation
// that would set a new peak), while a device-wide counter would be written by every launch and every worker.
namespace {
struct DeviceProgress {
  bool busy = false;   // a stream other than the excepted one has work pending
  uint64_t finished = 0;
};
DeviceProgress device_progress(int device, int64_t except) {
  DeviceProgress p;
  for (int64_t id = 0; id < kStreamIds; ++id) {
    StreamState* s = g_streams[device][id].load(std::memory_order_acquire);
    if (!s) continue;
    p.finished += s->finished.load(std::memory_order_relaxed);
    if (id != except && s->pending.load(std::memory_order_acquire) > 0) p.busy = true;
  }
  return p;
}
}  // namespace

bool device_busy_besides(int device, int64_t stream) {
  check_device(device);
  if (stream >= 0) check_stream(stream);
  return device_progress(device, stream).busy;
}

bool device_drain(int device, std::chrono::milliseconds stall) {
  check_device(device);
  DeviceProgress p = device_progress(device, -1);
  if (!p.busy) return true;
  void* token = g_blocking_hooks.before ? g_blocking_hooks.before() : nullptr;
  uint64_t seen = p.finished;
  int64_t last_progress = now_ns();
  const int64_t stall_ns = std::chrono::nanoseconds(stall).count();
  bool drained = true;
  // Polled, not woken: the device's streams each have their own condition variable, and a drain is rare
  // (an allocation that would set a new peak); yields first, then 50 us sleeps, never a busy spin.
  for (int polls = 0; (p = device_progress(device, -1)).busy; ++polls) {
    const int64_t now = now_ns();
    if (p.finished != seen) {
      seen = p.finished;
      last_progress = now;
    } else if (now - last_progress > stall_ns) {
      drained = false;
      break;
    }
    if (polls < 64) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (g_blocking_hooks.after) g_blocking_hooks.after(token);
  return drained;
}

void device_synchronize(int device) {
  check_device(device);
  for (int64_t s = 0; s < kStreamIds; ++s) {
    if (g_streams[device][s].load(std::memory_order_acquire)) stream_synchronize(device, s);
  }
}

}  // namespace npudist::runtime
