// NPUGraph capture and replay (docs/graphs.md).
//
// While a stream is capturing, every npu op dispatched on it still runs (so its outputs exist and have
// their real shapes), and is also recorded: the fallback records the boxed op with its CPU-alias arguments,
// the copy kernel records the copy. Replay re-runs the recorded CPU kernels from C++ over the same bytes,
// with no Python and no dispatch above the CPU kernel. A graph owns every storage its tasks touch, so those
// bytes stay valid across replays and are never handed to eager code (its private pool).
//
// The hooks below cost one relaxed atomic load when no capture is active. Only forward declarations here,
// so guard.cpp (c10 only) stays quick to compile.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace c10 {
class OperatorHandle;
struct IValue;
struct GeneratorImpl;
struct StorageImpl;
}  // namespace c10
namespace at {
class Tensor;
}
namespace pybind11 {
class module_;
}

namespace npudist::graph {

extern std::atomic<int> g_active_captures;
inline bool any_capture_active() { return g_active_captures.load(std::memory_order_relaxed) != 0; }

// Raises a RuntimeError if `what` (a host synchronisation or a host read) is not permitted now: the calling
// thread's current stream is capturing, or a capture in "global" mode (any thread) or "thread_local" mode
// (this thread) is active. Call only when any_capture_active().
void check_not_capturing(const char* what);

// Fallback hook, called when any_capture_active() after the arguments were replaced by their CPU aliases
// and before the kernel runs. Returns null when the op's stream is not capturing; raises (and invalidates
// the capture) for an op that cannot be captured. `npu_storages` are the storages of the npu arguments.
struct OpRecording;
struct OpRecordingDeleter {
  void operator()(OpRecording* r) const;
};
using OpRecordingPtr = std::unique_ptr<OpRecording, OpRecordingDeleter>;
OpRecordingPtr begin_op(const c10::OperatorHandle& op, int device, const std::vector<c10::IValue>& stack,
                                      size_t nargs, bool has_cpu_tensor_args, int64_t generator_slot,
                                      c10::GeneratorImpl* generator,
                                      const std::vector<c10::StorageImpl*>& npu_storages);
// After the kernel ran and its results were mapped to npu tensors (the last `nret` stack entries).
void end_op(OpRecordingPtr recording, const std::vector<c10::IValue>& stack, size_t nret,
            uint64_t random_numel);

// Copy kernel hook, called when any_capture_active() before the copy runs: records an npu -> npu copy on a
// capturing stream; a copy between npu and CPU raises where check_not_capturing would.
void on_copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);

void init_bindings(pybind11::module_& m);

}  // namespace npudist::graph
