// Plain-C function table through which a separately built extension (npudist.hccl._C) reaches the
// device runtime without linking against npudist._C (Python extensions are loaded RTLD_LOCAL).
// Obtained in Python as `npudist._C._runtime_api()` (an integer address) and handed to the other
// extension once at import time. Modelled on aclrtLaunchCallback / cudaLaunchHostFunc.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPUDIST_RUNTIME_API_VERSION 2

typedef void (*npudist_host_fn)(void* arg);

// Where a buffer lives inside a shareable device segment (a memfd mapping, see host_memory.h): a peer
// process on the same host maps it through /proc/<pid>/fd/<fd> and reads/writes the bytes directly.
typedef struct NpudistSharedRef {
  int32_t fd;             // the segment's memfd in the owning process
  uint64_t segment_id;    // unique per process, never reused
  uint64_t segment_size;  // bytes
  uint64_t offset;        // of the buffer within the segment
  uint64_t epoch;         // how many shareable segments the process has released so far
} NpudistSharedRef;

typedef struct NpudistRuntimeApi {
  uint32_t version;  // NPUDIST_RUNTIME_API_VERSION
  // Run fn(arg) on the stream's worker after all work enqueued before it (async w.r.t. the caller).
  // fn runs on a worker thread; a host blocked waiting for the stream has released the Python GIL.
  void (*launch_host_func)(int device, int64_t stream_id, npudist_host_fn fn, void* arg);
  // Block the calling thread until all work enqueued on the stream so far has run.
  void (*stream_synchronize)(int device, int64_t stream_id);
  // 1 if the stream's queue is empty (nothing pending), else 0.
  int (*stream_query)(int device, int64_t stream_id);
  // 1 and *ref filled if [ptr, ptr + bytes) lies inside one shareable device segment, else 0.
  int (*shared_memory_lookup)(const void* ptr, uint64_t bytes, NpudistSharedRef* ref);
} NpudistRuntimeApi;

#ifdef __cplusplus
}
#endif
