// Device busy time (launch.h, busy_begin / utilization): per device, the count of kernels running now and the
// busy time of the past ~2 s in buckets of kBusyBucketNs. Kernels run on stream workers and on launching
// threads at once, so the busy time is the union of their run times: a busy period starts when the device's
// running count goes 0 -> 1 and ends when it goes back to 0, and only those two transitions read the clock.
// Lock-free: launching threads pay this per kernel (benchmarks/async_launch.py measures the tiny-op cost).
#include "launch/launch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "npudist/runtime_c_api.h"

namespace npudist::launch {
namespace {

// 128 buckets of ~16.8 ms: 2.1 s of history, so a window of up to kMaxUtilizationWindowNs (2 s) is whole
// while a kernel that ended a moment ago is still being added.
constexpr int kBuckets = 128;
static_assert(kMaxUtilizationWindowNs <= (kBuckets - 4) * kBusyBucketNs, "the window must fit the history");
// A bucket is one word: the bucket's epoch (its start / kBusyBucketNs) above kBusyBits bits of busy ns, so a
// closer adds to it with one compare-exchange and a bucket of an older epoch is replaced, not added to.
constexpr int kBusyBits = 26;  // holds kBusyBucketNs (2^24): a bucket's busy time never exceeds its length
constexpr uint64_t kBusyMask = (uint64_t{1} << kBusyBits) - 1;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct alignas(64) DeviceBusy {
  std::atomic<int> running{0};
  std::atomic<int64_t> open_since{0};  // start of the busy period while running > 0
  // A seqlock for readers with several writers: a closing transition increments `entered`, ends the period
  // and adds it to the buckets, then increments `left`; a reader whose snapshot saw left == entered before and
  // after saw no close midway.
  std::atomic<uint64_t> entered{0};
  std::atomic<uint64_t> left{0};
  std::atomic<uint64_t> buckets[kBuckets] = {};
};

DeviceBusy g_busy[NPUDIST_MAX_DEVICES];

void add_to_bucket(DeviceBusy& d, int64_t epoch, int64_t ns) {
  std::atomic<uint64_t>& slot = d.buckets[epoch % kBuckets];
  uint64_t v = slot.load(std::memory_order_relaxed);
  for (;;) {
    const int64_t held = static_cast<int64_t>(v >> kBusyBits);
    if (held > epoch) return;  // the slot moved on to a later epoch: this part is older than the history
    const uint64_t busy = held == epoch ? (v & kBusyMask) : 0;
    const uint64_t next = (static_cast<uint64_t>(epoch) << kBusyBits) |
                          std::min<uint64_t>(busy + static_cast<uint64_t>(ns), kBusyMask);
    if (slot.compare_exchange_weak(v, next, std::memory_order_release, std::memory_order_relaxed)) return;
  }
}

// Spread the closed busy period [start, end) over the buckets it covers (only the last kBuckets of them).
void add_period(DeviceBusy& d, int64_t start, int64_t end) {
  if (end <= start) return;
  const int64_t last = end / kBusyBucketNs;
  for (int64_t e = std::max(start / kBusyBucketNs, last - kBuckets + 1); e <= last; ++e) {
    const int64_t lo = std::max(start, e * kBusyBucketNs), hi = std::min(end, (e + 1) * kBusyBucketNs);
    if (hi > lo) add_to_bucket(d, e, hi - lo);
  }
}

DeviceBusy* busy_of(int device) {
  return device >= 0 && device < NPUDIST_MAX_DEVICES ? &g_busy[device] : nullptr;
}

}  // namespace

void busy_begin(int device) {
  DeviceBusy* d = busy_of(device);
  if (!d) return;
  int c = d->running.load(std::memory_order_relaxed);
  for (;;) {
    if (c > 0) {
      if (d->running.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) return;
      continue;
    }
    // 0 -> 1: the start is published before the count, so a reader that sees the device running sees its
    // start. No seqlock section: a reader ignores open_since while nothing runs, and a period that closes
    // (and reopens) under a reader is caught by the closer's section. An opener that lost the race to another
    // has overwritten the start with its own clock read, nanoseconds apart.
    d->open_since.store(now_ns(), std::memory_order_relaxed);
    if (d->running.compare_exchange_strong(c, 1, std::memory_order_seq_cst)) return;
  }
}

void busy_end(int device) {
  DeviceBusy* d = busy_of(device);
  if (!d) return;
  int c = d->running.load(std::memory_order_relaxed);
  for (;;) {
    if (c <= 0) return;  // an end without its begin: nothing is running to end
    if (c > 1) {
      if (d->running.compare_exchange_weak(c, c - 1, std::memory_order_acq_rel)) return;
      continue;
    }
    // 1 -> 0: the busy period [open_since, now) goes into the buckets within the same seqlock section.
    d->entered.fetch_add(1, std::memory_order_seq_cst);
    const int64_t start = d->open_since.load(std::memory_order_relaxed);
    const int64_t end = now_ns();
    const bool closed = d->running.compare_exchange_strong(c, 0, std::memory_order_seq_cst);
    if (closed) add_period(*d, start, end);
    d->left.fetch_add(1, std::memory_order_seq_cst);
    if (closed) return;
  }
}

int utilization(int device, int64_t window_ns) {
  DeviceBusy* d = busy_of(device);
  if (!d) throw std::out_of_range("utilization: invalid npu device index " + std::to_string(device));
  if (window_ns < 2 * kBusyBucketNs || window_ns > kMaxUtilizationWindowNs) {
    throw std::invalid_argument("utilization: window_ns " + std::to_string(window_ns) + " is outside " +
                                std::to_string(2 * kBusyBucketNs) + ".." + std::to_string(kMaxUtilizationWindowNs));
  }
  int64_t now = 0, from = 0, busy = 0;
  // A transition takes a few clock reads; a reader that keeps meeting them (a device running tiny kernels
  // back to back) takes its snapshot between two of them within a few tries.
  for (int attempt = 0;; ++attempt) {
    const uint64_t before = d->left.load(std::memory_order_seq_cst);
    now = now_ns();
    from = (now - window_ns) / kBusyBucketNs + 1;  // the first bucket that starts inside the window
    busy = 0;
    for (int64_t e = from; e <= now / kBusyBucketNs; ++e) {
      const uint64_t v = d->buckets[e % kBuckets].load(std::memory_order_acquire);
      if (static_cast<int64_t>(v >> kBusyBits) == e) busy += static_cast<int64_t>(v & kBusyMask);
    }
    if (d->running.load(std::memory_order_seq_cst) > 0) {
      busy += now - std::max(d->open_since.load(std::memory_order_relaxed), from * kBusyBucketNs);
    }
    if (d->entered.load(std::memory_order_seq_cst) == before || attempt >= 1000) break;
    if (attempt >= 16) std::this_thread::yield();
  }
  const int64_t span = now - from * kBusyBucketNs;
  if (span <= 0 || busy <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(100, (busy * 100 + span / 2) / span));
}

}  // namespace npudist::launch
