// Plain-C table through which npudist.hccl._C reports its collectives to the npu device profiler that
// lives in npudist._C (the Kineto PrivateUse1 activity source, device_core/profiler.cpp). Handed over
// once at import (`npudist._C._profiler_api()`, a PyCapsule named NPUDIST_PROFILER_API_CAPSULE, ->
// `npudist.hccl._C._set_profiler_api(capsule)`), like the runtime table in runtime_c_api.h. Kept separate
// from that table so either can change alone.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPUDIST_PROFILER_API_VERSION 1
#define NPUDIST_PROFILER_API_CAPSULE "npudist.profiler_api"

// One collective as it ran on an npu stream. Strings are copied by record_collective.
typedef struct NpudistCollectiveEvent {
  const char* name;        // e.g. "all_gather_into_tensor"
  const char* dtype;       // e.g. "Float"
  const char* group_name;  // c10d group name
  const char* group_desc;  // c10d group description ("default_pg", "mesh_dp"...)
  const char* group_ranks; // global ranks of the group, "[0, 1]"
  int32_t device;          // npu device index
  int64_t stream;          // stream id the op is ordered on (the group's comm stream when async)
  int64_t start_ns;        // system_clock nanoseconds since the epoch
  int64_t end_ns;
  uint64_t correlation;    // torch op correlation id at launch (0: none)
  int64_t in_nelems;       // elements of all inputs (as NCCL's record_param_comms "In msg nelems")
  int64_t out_nelems;      // elements of all outputs ("Out msg nelems")
  uint64_t seq;            // the group's sequence number of this op (p2p ops have their own counter)
  int32_t group_size;
  int32_t rank;            // group rank of this process
  int32_t p2p;             // 1 for send/recv
  int32_t peer;            // p2p peer (group rank), else -1
} NpudistCollectiveEvent;

typedef struct NpudistProfilerApi {
  uint32_t version;  // NPUDIST_PROFILER_API_VERSION
  // Points to a std::atomic<int> (C++ side): nonzero while an npu profiling session records. Read it
  // with one relaxed load per op; everything else is only touched when it is set.
  const void* active_flag;
  // The innermost torch op correlation id of the calling thread (0 outside any profiled op).
  uint64_t (*current_correlation)(void);
  int64_t (*now_ns)(void);
  void (*record_collective)(const NpudistCollectiveEvent* event);
} NpudistProfilerApi;

#ifdef __cplusplus
}
#endif
