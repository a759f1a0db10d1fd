// hccl collectives as npu device activity in torch.profiler: each collective becomes one event on the
// stream it is ordered on, with op, dtype, element counts, group and sequence number, reported to the
// device profiler in npudist._C through its C table (device_core/include/npudist/profiler_c_api.h).
// With no profiler recording, each hook costs one relaxed atomic load.
#pragma once
#include <atomic>
#include <cstdint>

#include "npudist/profiler_c_api.h"

namespace npudist::hccl {

class WorkHCCL;

namespace profiling {

extern const NpudistProfilerApi* g_api;  // set once at import, before any group exists

inline bool active() {
  return g_api && static_cast<const std::atomic<int>*>(g_api->active_flag)->load(std::memory_order_relaxed);
}

// When the op is issued, on the issuing thread: remember the torch op that issued the work and the npu stream the
// op is ordered on (the caller's current stream when it runs synchronously, else the group's comm stream).
void note_issue(const WorkHCCL& work, int device, int64_t stream);

// Around the op's execution (on whichever thread runs it): records its start/end.
class CollectiveScope {
 public:
  explicit CollectiveScope(const WorkHCCL& work) {
    if (active()) begin(work);
  }
  ~CollectiveScope() {
    if (work_) end();
  }
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;

 private:
  void begin(const WorkHCCL& work);
  void end();
  const WorkHCCL* work_ = nullptr;
  int device_ = -1;
  int64_t stream_ = 0;
  uint64_t correlation_ = 0;
  int64_t start_ns_ = 0;
};

// The hand-over from Python (`_set_profiler_api(capsule)`, npudist.hccl._hand_over_runtime).
void set_api(const NpudistProfilerApi* api);

}  // namespace profiling
}  // namespace npudist::hccl
