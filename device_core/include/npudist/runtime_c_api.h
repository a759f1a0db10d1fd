// Plain-C function table through which a separately built extension (npudist.hccl._C) reaches the
// device runtime without linking against npudist._C (Python extensions are loaded RTLD_LOCAL).
// Obtained in Python as `npudist._C._runtime_api()` (an integer address) and handed to the other
// extension once at import time. Modelled on aclrtLaunchCallback / cudaLaunchHostFunc.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPUDIST_RUNTIME_API_VERSION 1

typedef void (*npudist_host_fn)(void* arg);

typedef struct NpudistRuntimeApi {
  uint32_t version;  // NPUDIST_RUNTIME_API_VERSION
  // Run fn(arg) on the stream's worker after all work enqueued before it (async w.r.t. the caller).
  // fn runs on a worker thread; a host blocked waiting for the stream has released the Python GIL.
  void (*launch_host_func)(int device, int64_t stream_id, npudist_host_fn fn, void* arg);
  // Block the calling thread until all work enqueued on the stream so far has run.
  void (*stream_synchronize)(int device, int64_t stream_id);
  // 1 if the stream's queue is empty (nothing pending), else 0.
  int (*stream_query)(int device, int64_t stream_id);
} NpudistRuntimeApi;

#ifdef __cplusplus
}
#endif
