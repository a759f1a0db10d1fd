// Cross-process signalling in shared memory: a monotone counter with a futex word, and bounded waits that
// spin briefly, then sched_yield, then sleep on the futex (so 4 ranks on 2 cores stay fast), while watching
// for abort, dead peers and the deadline. Internal to the engine.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace npudist::shm::detail {

using Clock = std::chrono::steady_clock;

// One cache line: `value` only grows; `word` changes on every post so futex sleepers notice; `cpu` is the
// CPU the poster ran on at its last post (a hint for waiters: a peer last seen on the waiter's own CPU
// cannot post while the waiter spins there). `carried` is the line's spare bytes, the poster's to use: written
// before post() and read after a wait for that post, they reach the waiter with the line it waited on, at no
// further cache miss (the engine's tiny-collective cells, shm_engine_impl.h).
struct alignas(64) Signal {
  std::atomic<uint64_t> value;
  std::atomic<uint32_t> word;
  std::atomic<uint32_t> waiters;
  std::atomic<int32_t> cpu;
  static constexpr size_t kCarriedBytes = 44;
  unsigned char carried[kCarriedBytes];

  void post(uint64_t v);
  void wake_all();
};
static_assert(sizeof(Signal) == 64, "Signal must be one cache line");

// Identity of a process that survives pid reuse: pid plus its start time from /proc/<pid>/stat.
struct ProcessId {
  int32_t pid;
  uint64_t start_time;
};
ProcessId self_process_id();
// False when the process has exited (also when it is a zombie nobody reaped yet).
bool process_alive(const ProcessId& p);

// Tunables read once from the environment (NPUDIST_ENGINE_SPIN_US, NPUDIST_ENGINE_YIELD_US); spin_ns is
// negative when NPUDIST_ENGINE_SPIN_US is unset (then spin_ns_for decides by the communicator's size).
struct WaitTuning {
  int64_t spin_ns;
  int64_t yield_ns;
};
const WaitTuning& wait_tuning();
// How long a wait of a communicator of `ranks` local ranks spins before yielding: NPUDIST_ENGINE_SPIN_US if
// set, else 20 us while the ranks fit the cores (a peer that is a few us late is running on its own core) and
// 2 us when they outnumber them (the awaited peer may need this core).
int64_t spin_ns_for(int ranks);

// What a wait must watch besides its own condition. `on_fail` throws the right CommError; it is told
// why the wait gave up (0 = deadline passed, 1 = aborted, 2 = peer `peer` died).
struct WaitContext {
  // The op's deadline. A collective's is unset (time_since_epoch 0) until one of its waits outlasts the spin
  // phase, which sets it to that wait's start + `timeout`: beginning an op reads no clock, and the waits of a
  // small op end while spinning. (Waits take the context const; the deadline is the one part they set.)
  mutable Clock::time_point deadline{};
  Clock::duration timeout{};
  const std::atomic<uint32_t>* abort_flag;
  std::function<bool(int)> peer_alive;  // checked every few ms while sleeping
  std::function<void(int why, int peer)> on_fail;
  int64_t spin_ns = 2000;  // spin_ns_for(the communicator's ranks)
};

enum : int { kWhyTimeout = 0, kWhyAborted = 1, kWhyPeerDied = 2 };

// Waits until sig.value >= target. `peer` is the rank that posts `sig` (for liveness checks).
void wait_at_least(const Signal& sig, uint64_t target, int peer, const WaitContext& ctx);

}  // namespace npudist::shm::detail
