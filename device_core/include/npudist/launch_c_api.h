// Plain-C table through which npudist.hccl._C takes part in npudist._C's asynchronous launch
// (device_core/launch/launch.h, docs/device.md "Asynchronous launch"). Handed over once at import
// (`npudist._C._launch_api()`, a PyCapsule named NPUDIST_LAUNCH_API_CAPSULE, ->
// `npudist.hccl._C._set_launch_api(capsule)`), like the runtime and profiler tables.
//
// Why it exists: a collective's body runs on the host (the caller's thread or a hccl lane) after hccl has
// ordered it behind the npu stream it was issued on. The aten ops the body calls on npu tensors
// (contiguous(), copy_ into a strided output...) must run right there, on that thread: queued on a
// stream they would run after the body has already read or written the bytes through data_ptr(), and
// draining a stream from a lane could wait on a stream that itself waits for this collective.
// On a real device the collective is a kernel on the comm stream and needs no counterpart.
//
// Version 2 lets hccl's Work.wait() order the caller's stream after a collective without blocking the host
// (as NCCL does): it asks whether launches are asynchronous at all, and a host function it queued on the
// stream reports a failed collective to the next synchronization point, like a failed kernel.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPUDIST_LAUNCH_API_VERSION 2
#define NPUDIST_LAUNCH_API_CAPSULE "npudist.launch_api"

typedef struct NpudistLaunchApi {
  uint32_t version;  // NPUDIST_LAUNCH_API_VERSION
  // While nonzero, npu ops called on the calling thread run inline on it without draining any stream (as
  // with ASCEND_LAUNCH_BLOCKING=1, for this thread only). Returns the previous setting, to restore.
  int (*set_thread_inline)(int enable);
  // --- Version 2 ---
  // 1 when npu ops called on the calling thread are queued on streams (asynchronous launch), else 0.
  int (*launches_async)(void);
  // Record `message` as an asynchronous error: the next synchronization point (torch.npu.synchronize(),
  // .item(), .cpu() ...) raises it as a RuntimeError. Only the first error since the last report is kept.
  void (*record_async_error)(const char* message);
} NpudistLaunchApi;

#ifdef __cplusplus
}
#endif
