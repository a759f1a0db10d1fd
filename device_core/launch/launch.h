// Asynchronous kernel launch (docs/device.md, "Asynchronous launch"): the glue checks arguments and
// allocates outputs on the calling thread, then enqueues the kernel on the current stream's task queue;
// the stream's worker runs it. c10-free on purpose, so guard.cpp (c10-only) can include it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "npudist/launch_c_api.h"

namespace npudist::launch {

// True when ASCEND_LAUNCH_BLOCKING=1 (or NPUDIST_LAUNCH_BLOCKING=1) selected blocking launch: every op
// runs on the calling thread and nothing drains, exactly the host-synchronous behaviour. The environment is
// read once; a thread that set itself inline through the C table (launch_c_api.h) is blocking too, and so is
// every thread at task-queue level 0.
bool blocking();

// The one answer to "may this kernel be queued now?": not under blocking launch (above), and not while a session
// holds launch synchronous: a profiler recording (its kernel events time each kernel on the calling thread) or an
// NPUGraph capturing (capture records each op on the calling thread as it runs). Those report their sessions
// through hold_synchronous(+1 / -1), so the state is launch's and launch depends on neither.
// A sync-launch stream (is_sync_launch_stream) current on `device` (-1: the current device) answers false too:
// its kernels run on the launching thread, after the work queued on it.
bool may_queue(int device = -1);
void hold_synchronous(int delta);

// torch.npu.SyncLaunchStream (torch_npu: "a NPU stream which doesn't enable taskqueue"): the per-stream launch
// mode. Its ids are a fixed pool above torch's (runtime_c_api.h, NPUDIST_SYNC_LAUNCH_STREAM_FIRST), so the mode
// is the id itself and asking costs no lookup. sync_launch_stream hands the pool out round robin, as torch's.
bool is_sync_launch_stream(int64_t stream);
int64_t sync_launch_stream(int device);

// torch_npu's task-queue level: 0 (synchronous), 1 or 2 (queued). Blocking launch reports 0 whatever was set.
int task_queue_level();
// Callers drain every device first: kernels queued before a switch to 0 would otherwise never be waited for.
void set_task_queue_level(int level);

// The C table of launch_c_api.h (one static instance).
const NpudistLaunchApi* c_api();

// What the launch path knows of a kernel before it runs: whether it would run inline on an idle stream, and then
// its learnt time on the worker (what an inline launch behind it waits for, take_inline).
struct LaunchCost {
  int64_t inline_ns = -1;  // a kernel that would run inline on an idle stream: its learnt CPU time; else -1
};

// Run `kernel` on `device`'s current stream after the work queued there. Whatever the closure captured stays
// alive until the kernel ran and a launching thread called release_finished(). Npu memory the kernel uses is
// captured as the op path decides (npu_tensor.h, queued_cpu_alias): blocks reused in the stream's order are not
// held at all. A kernel that throws records an error naming `op` and the Python line that launched it; the next
// synchronization point raises it. Waits (the Python GIL released) while the stream holds queue_depth() kernels.
// On a sync-launch stream the kernel runs here instead, once the stream ran its queued work, and its error is
// raised at the call.
void enqueue(int device, const char* op, std::function<void()> kernel, LaunchCost cost = {});

// True on a thread that has queued a kernel (enqueue): a host thread that launches, not a stream's worker nor a
// collective's thread. Only such a thread may wait for the device on its own behalf (the allocator's
// before_new_peak): a worker waiting for the device would wait for itself.
bool launching_thread();

// The inline-or-enqueue decision for a kernel the caller found cheaper than its hand-off (`candidate`: it touches at
// most kInlineBytes and its inline run took less than inline_kernel_ns(); op_path.h, KernelCost). True: run it
// on the calling thread now; the stream is idle, and what an inline run does first is done (counted, finished
// kernels released, their warnings raised), so it then behaves as under blocking launch: a failure raises at
// the call. False: enqueue it. A candidate waits for a stream whose queued work is only other candidates
// (the Python GIL released after a short spin; at most their learnt times summed plus 20 us). Why wait: a host
// that got ahead of the worker (while a signature was being sampled, or behind one larger kernel) would
// otherwise stay ahead, since the worker takes longer per tiny kernel than the host, and every later tiny
// kernel would pay the hand-off. Raises only a queued kernel's warning; a recorded kernel error stays for the
// next synchronization point.
bool take_inline(int device, bool candidate);

// A kernel that touches at most kInlineBytes and whose run on the launching thread took less than
// inline_kernel_ns() (op_path.h, KernelCost) runs there when its stream is idle instead of being queued
// (NPUDIST_LAUNCH_INLINE_NS, default kDefaultInlineNs in launch.cpp; 0: never). Why: handing a kernel to the
// stream's worker (the task, the push, waking the worker, moving the arguments' cache lines to its core) costs
// the host more than such a kernel takes, and an idle stream has nothing the host could overlap it with.
// Running it at once is what an asynchronous launch may always do; it is ordered after everything queued
// because nothing is. Read once; a malformed value is a ValueError at the first op.
constexpr int64_t kInlineBytes = 64 << 10;
int64_t inline_kernel_ns();

// Block until `device`'s current stream ran everything queued on it, then raise a recorded kernel error.
// Every host access to npu bytes outside a queued kernel calls this first. No-op in blocking mode.
void drain(int device);

// Raise (and clear) the first recorded kernel error as a RuntimeError, if there is one.
void raise_pending_error();

// Destroy the kernels that ran since the last call, releasing what their closures captured (memory they held,
// e.g. another stream's block, returns to the caching allocator here). Every launch and synchronization point
// calls it, so memory is back by the time the host next allocates or observes it. True if it released anything.
bool release_finished();

// Raise, on the calling thread, the C++ warnings that queued kernels raised on their workers since the last
// call (enqueue and after_sync call it: they reach Python at the next launch or synchronization point).
void raise_queued_warnings();

// What a synchronization point does once the stream or device is idle: release_finished(),
// raise_queued_warnings(), then raise_pending_error().
void after_sync();

// Where the calling thread launches from, set by the Python module (module.cpp). `capture` runs at every
// launch and must be cheap: it returns an opaque token (the Python code object and instruction offset);
// `describe` turns a token into "file.py:12" (only when a kernel failed); `release` drops a token.
struct SiteHooks {
  void* (*capture)() = nullptr;
  std::string (*describe)(void* token) = nullptr;
  void (*release)(void* token) = nullptr;
  // Around a launch that waits for its stream's queue to shorten: release and retake the Python GIL if held.
  void* (*block_begin)() = nullptr;
  void (*block_end)(void* token) = nullptr;
};

// How many kernels a stream may hold queued before a launch waits for it to run half of them
// (NPUDIST_LAUNCH_QUEUE_DEPTH, default 1024, about a device launch queue's length; 0 = no limit). Read once.
// Kernels of every kind count alike: queued kernels hold no memory the host could reuse (docs/memory.md,
// "Stream-ordered reuse"), so the count is the only bound.
int queue_depth();
void set_site_hooks(SiteHooks hooks);

// Device busy time (launch_busy.cpp), behind torch.npu.utilization: the share of a past window during which at
// least one kernel of the device ran, on a stream's worker or on the launching thread. busy_begin/busy_end
// bracket each kernel; only a change of the device's running count between 0 and 1 reads the clock, and no
// lock is taken. utilization() answers an integer percent over the window ending now: at most
// kMaxUtilizationWindowNs back, measured in steps of kBusyBucketNs (the window starts at the first step that
// begins inside it).
constexpr int64_t kUtilizationWindowNs = 1000000000;  // torch.npu.utilization's sample period: 1 s
constexpr int64_t kBusyBucketNs = int64_t{1} << 24;   // about 16.8 ms
constexpr int64_t kMaxUtilizationWindowNs = 120 * kBusyBucketNs;
void busy_begin(int device);
void busy_end(int device);
int utilization(int device, int64_t window_ns = kUtilizationWindowNs);

class BusyScope {
 public:
  explicit BusyScope(int device) : device_(device) { busy_begin(device); }
  ~BusyScope() { busy_end(device_); }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  int device_;
};

// How many ops took each path since the last reset (measures how much of a program runs asynchronously).
struct Counts {
  uint64_t queued = 0;  // kernels enqueued
  uint64_t synchronous = 0;  // ops that drained the stream and ran on the calling thread
  uint64_t metadata = 0;  // view/metadata ops (no data access; never drain)
  uint64_t ran_inline = 0;  // queueable kernels run on the calling thread on an idle stream (inline_kernel_ns)
};
Counts counts();
void reset_counts();
void count_synchronous();
void count_metadata();
void count_inline();

}  // namespace npudist::launch
