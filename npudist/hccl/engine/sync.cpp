// Bounded waits: spin -> sched_yield -> futex sleep, each phase checking abort, deadline and peer liveness.
#include "sync.h"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace npudist::shm::detail {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Shared (not FUTEX_PRIVATE) futex ops: the word lives in a MAP_SHARED mapping used by several processes.
void futex_wait(const std::atomic<uint32_t>* addr, uint32_t expected, int64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

int64_t env_ns(const char* name, int64_t def_us) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def_us * 1000;
  char* end = nullptr;
  long long us = std::strtoll(v, &end, 10);
  if (end == v || us < 0) return def_us * 1000;
  return static_cast<int64_t>(us) * 1000;
}

// Reads field 22 (starttime) and the state letter of /proc/<pid>/stat. Returns false if unreadable.
bool read_proc_stat(int pid, char* state, uint64_t* start_time) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // comm (field 2) may contain spaces and parentheses: parse from the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p || p[1] == 0) return false;
  p += 2;
  *state = *p;
  // After ')': field 3 is state; starttime is field 22, i.e. 19 more fields after state.
  int field = 3;
  while (*p && field < 22) {
    if (*p == ' ') ++field;
    ++p;
  }
  *start_time = std::strtoull(p, nullptr, 10);
  return true;
}

}  // namespace

void Signal::post(uint64_t v) {
  cpu.store(sched_getcpu(), std::memory_order_relaxed);
  value.store(v, std::memory_order_release);
  word.fetch_add(1, std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) != 0) futex_wake(&word);
}

void Signal::wake_all() {
  word.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&word);
}

ProcessId self_process_id() {
  ProcessId id{static_cast<int32_t>(getpid()), 0};
  char state = 0;
  read_proc_stat(id.pid, &state, &id.start_time);
  return id;
}

bool process_alive(const ProcessId& p) {
  if (p.pid <= 0) return true;  // not attached yet: nothing to judge
  if (kill(p.pid, 0) != 0 && errno == ESRCH) return false;
  char state = 0;
  uint64_t start = 0;
  if (!read_proc_stat(p.pid, &state, &start)) return kill(p.pid, 0) == 0 || errno != ESRCH;
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  return p.start_time == 0 || start == p.start_time;  // different start time: pid was reused
}

const WaitTuning& wait_tuning() {
  static const WaitTuning t = [] {
    WaitTuning w;
    w.spin_ns = env_ns("NPUDIST_ENGINE_SPIN_US", -1);
    // Short: a yielding task loses its place to other runnable tasks on a busy machine, while a futex
    // sleeper is woken (and preferred by the scheduler) as soon as the peer posts.
    w.yield_ns = env_ns("NPUDIST_ENGINE_YIELD_US", 50);
    return w;
  }();
  return t;
}

int64_t spin_ns_for(int ranks) {
  const int64_t env = wait_tuning().spin_ns;
  if (env >= 0) return env;
  const unsigned cores = std::thread::hardware_concurrency();
  // 2 ranks on 2 cores beside two compiler jobs: 20 us against 2 us took the 8 B all_reduce from 15-19 us
  // to 11-15 us (docs/hccl_engine.md, "Per-call cost breakdown"). With ranks outnumbering the cores, long
  // spins hold the core the late peer needs.
  return cores != 0 && static_cast<unsigned>(ranks) <= cores ? 20'000 : 2'000;
}

void wait_at_least(const Signal& sig, uint64_t target, int peer, const WaitContext& ctx) {
  if (sig.value.load(std::memory_order_acquire) >= target) return;
  const WaitTuning& tune = wait_tuning();
  const int64_t spin_ns = ctx.spin_ns;
  auto start = Clock::now();
  // Phase 1: spin (cheap when the peer runs on another core). A peer that last posted from this CPU is
  // most likely queued behind this thread (ranks packed onto one core on a busy machine): spinning would
  // only delay it, so the wait yields at once.
  const int my_cpu = sched_getcpu();
  for (uint32_t i = 1; sig.cpu.load(std::memory_order_relaxed) != my_cpu; ++i) {
    if (sig.value.load(std::memory_order_acquire) >= target) return;
    cpu_relax();
    if ((i & 63) == 0) {
      if (ctx.abort_flag->load(std::memory_order_relaxed)) ctx.on_fail(kWhyAborted, peer);
      if ((Clock::now() - start).count() >= spin_ns) break;
    }
  }
  // Phase 2: yield the core (the peer may need it), then phase 3: futex sleep in short slices.
  if (ctx.deadline.time_since_epoch().count() == 0) ctx.deadline = start + ctx.timeout;
  auto last_check = Clock::now();
  auto* mutable_sig = const_cast<Signal*>(&sig);
  for (;;) {
    auto now = Clock::now();
    if (ctx.abort_flag->load(std::memory_order_relaxed)) ctx.on_fail(kWhyAborted, peer);
    if (now >= ctx.deadline) {
      if (sig.value.load(std::memory_order_acquire) >= target) return;
      ctx.on_fail(kWhyTimeout, peer);
    }
    if (now - last_check >= std::chrono::milliseconds(5)) {
      last_check = now;
      if (ctx.peer_alive && !ctx.peer_alive(peer)) {
        if (sig.value.load(std::memory_order_acquire) >= target) return;
        ctx.on_fail(kWhyPeerDied, peer);
      }
    }
    if ((now - start).count() < spin_ns + tune.yield_ns) {
      sched_yield();
      if (sig.value.load(std::memory_order_acquire) >= target) return;
      continue;
    }
    mutable_sig->waiters.fetch_add(1, std::memory_order_seq_cst);
    uint32_t w = sig.word.load(std::memory_order_seq_cst);
    if (sig.value.load(std::memory_order_seq_cst) >= target) {
      mutable_sig->waiters.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(ctx.deadline - now).count();
    int64_t slice = std::min<int64_t>(std::max<int64_t>(left, 0) + 1000, 10'000'000);
    futex_wait(&sig.word, w, slice);
    mutable_sig->waiters.fetch_sub(1, std::memory_order_relaxed);
    if (sig.value.load(std::memory_order_acquire) >= target) return;
  }
}

}  // namespace npudist::shm::detail
