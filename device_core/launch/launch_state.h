// The thread-local state a queued kernel runs under (launch.cpp's QueuedKernel): the launching thread's own
// at::ThreadLocalState, captured once per launch, installed on the stream worker around the kernel.
#pragma once
#include <ATen/ThreadLocalState.h>

#include <memory>

namespace npudist::launch {

// `plain`: the state holds no Python object (no dispatch or torch-function mode, no functorch or debug info, no
// thread-local RecordFunction callbacks, saved objects or graph-exec group). Only a plain state may be dropped
// on a worker, and only a plain state is shared between launches (capture_launch_state).
struct CapturedState {
  at::ThreadLocalState tls;
  bool plain;
};
using LaunchState = std::shared_ptr<const CapturedState>;

// PyTorch's at::ThreadLocalState of the calling thread, as its autograd engine carries it to its worker threads:
// everything the dispatcher and autograd consult comes along (grad and inference mode, autocast state and dtypes,
// the dispatch-key include/exclude sets, functionalization, forward AD, profiler and functorch state), so a
// kernel's CPU ops dispatch on the worker as they would have on the launcher. Saved-tensor default hooks are left
// out (launch_state.cpp says why). A plain state equal in every part to the thread's previous launch's is that
// launch's object again: the worker then knows by identity that it already runs under it.
LaunchState capture_launch_state();

// On a stream worker, around one kernel: installs the launcher's state, minus the Python dispatch keys, unless
// it is the plain state the worker already runs under. A plain state stays installed after the kernel, as the
// next kernel of the same launcher most likely needs it again; any other is replaced by the worker's own at once,
// while the task still holds its references: a worker must never drop the last reference to a Python object.
class WorkerStateScope {
 public:
  explicit WorkerStateScope(const LaunchState& state);
  ~WorkerStateScope();
  WorkerStateScope(const WorkerStateScope&) = delete;
  WorkerStateScope& operator=(const WorkerStateScope&) = delete;

 private:
  bool plain_;
};

}  // namespace npudist::launch
