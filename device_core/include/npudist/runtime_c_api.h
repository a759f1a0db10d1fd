// The npu device runtime as a plain-C ABI: the one seam between device_core's torch glue / caching
// allocator / npudist.hccl and the runtime that owns devices, memory, streams and events. The emulated
// runtime (device_core/runtime*.cpp, host memory) implements it; an ACL-based runtime would be a second
// implementation of the same table (docs/backends.md, "Adding a real Ascend backend", maps each entry to
// its ACL call).
//
// Inside npudist._C the glue reaches the table through npudist_runtime_api(). A separately built extension
// (npudist.hccl._C; Python extensions are loaded RTLD_LOCAL) receives the same table from Python as the
// PyCapsule `npudist._C._runtime_api()`, named NPUDIST_RUNTIME_API_CAPSULE, and checks `version`.
//
// Conventions: functions returning npudist_status return NPUDIST_SUCCESS (0) or an error code, and then
// last_error() describes the failure (per thread, like aclGetRecentErrMsg). No function lets a C++
// exception escape. Stream ids are small integers per device: 0 is the device's default stream.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// 3: status codes; memory, copies, streams, events and device properties joined the table.
// 4: stream_wait_event (appended; a consumer built for version N works with any table of version >= N).
// 5: communication buffers held outside the caching allocator (comm_buffer_*).
// 6: the stream budget: stream_create holds a stream until stream_destroy; stream_from_pool; stream_hold.
// 7: stream id NPUDIST_GRAPH_CAPTURE_STREAM is valid on every device (NPUDIST_STREAM_IDS ids in all).
// 8: device_busy_besides and device_drain (the caching allocator lets the device catch up before a new peak).
#define NPUDIST_RUNTIME_API_VERSION 8
#define NPUDIST_RUNTIME_API_CAPSULE "npudist.runtime_api"
#define NPUDIST_MAX_DEVICES 64  // device_count() never exceeds it
// Stream ids NPUDIST_SYNC_LAUNCH_STREAM_FIRST .. + NPUDIST_SYNC_LAUNCH_STREAMS - 1 of every device are torch_npu's
// sync-launch pool (torch.npu.SyncLaunchStream): the glue runs every kernel launched on one of them on the
// launching thread, after the work queued there; to the runtime they are ordinary streams.
#define NPUDIST_SYNC_LAUNCH_STREAM_FIRST 65
#define NPUDIST_SYNC_LAUNCH_STREAMS 4
// Stream id NPUDIST_GRAPH_CAPTURE_STREAM of every device is torch.npu.graph's default capture stream. It has an id
// of its own above torch's round-robin pool (which would hand it out again as every 32nd torch.npu.Stream(), whose
// work would then be captured, or whose graph task update would be refused); to the runtime it is an ordinary stream.
#define NPUDIST_GRAPH_CAPTURE_STREAM (NPUDIST_SYNC_LAUNCH_STREAM_FIRST + NPUDIST_SYNC_LAUNCH_STREAMS)
// Stream ids 0 .. NPUDIST_STREAM_IDS - 1 are valid on every device.
#define NPUDIST_STREAM_IDS (NPUDIST_GRAPH_CAPTURE_STREAM + 1)

typedef int npudist_status;
enum {
  NPUDIST_SUCCESS = 0,
  NPUDIST_ERROR_INVALID_VALUE = 1,   // a malformed argument or environment variable
  NPUDIST_ERROR_INVALID_DEVICE = 2,  // device index or stream id out of range
  NPUDIST_ERROR_OUT_OF_MEMORY = 3,   // the host/device cannot provide the memory
  NPUDIST_ERROR_NOT_READY = 4,       // an event was not recorded or has not completed
  NPUDIST_ERROR_INTERNAL = 5,
  NPUDIST_ERROR_NO_STREAM_RESOURCE = 6  // the device's stream budget is used up (last_error() has the counts)
};

typedef enum NpudistMemcpyKind {
  NPUDIST_MEMCPY_HOST_TO_HOST = 0,
  NPUDIST_MEMCPY_HOST_TO_DEVICE = 1,
  NPUDIST_MEMCPY_DEVICE_TO_HOST = 2,
  NPUDIST_MEMCPY_DEVICE_TO_DEVICE = 3
} NpudistMemcpyKind;

typedef void (*npudist_host_fn)(void* arg);

// Where a buffer lives inside a shareable device segment (a memfd mapping in the emulated runtime): a peer
// process on the same host maps it through /proc/<pid>/fd/<fd> and reads/writes the bytes directly.
typedef struct NpudistSharedRef {
  int32_t fd;             // the segment's memfd in the owning process
  uint64_t segment_id;    // unique per process, never reused
  uint64_t segment_size;  // bytes
  uint64_t offset;        // of the buffer within the segment
  uint64_t epoch;         // how many shareable segments the process has released so far
} NpudistSharedRef;

typedef struct NpudistDeviceProperties {
  char name[64];
  uint64_t total_memory;   // bytes
  int32_t physical_index;  // index before ASCEND_RT_VISIBLE_DEVICES renumbering
} NpudistDeviceProperties;

typedef struct NpudistEvent_* NpudistEvent;  // opaque

// Called around every blocking wait (stream/event synchronize): the Python extension releases the GIL so
// that host functions needing it can run.
typedef void* (*npudist_before_block_fn)(void);
typedef void (*npudist_after_block_fn)(void* token);

typedef struct NpudistRuntimeApi {
  uint32_t version;  // NPUDIST_RUNTIME_API_VERSION

  // --- Streams: host functions (the first four entries keep their version-2 positions) ---
  // Run fn(arg) on the stream's worker after all work enqueued before it (async w.r.t. the caller).
  // fn runs on a worker thread and must not throw.
  npudist_status (*launch_host_func)(int device, int64_t stream, npudist_host_fn fn, void* arg);
  // Block the calling thread until all work enqueued on the stream so far has run.
  npudist_status (*stream_synchronize)(int device, int64_t stream);
  // 1 if nothing is pending on the stream, 0 if work is pending, -1 if the ids are invalid.
  int (*stream_query)(int device, int64_t stream);
  // 1 and *ref filled if [ptr, ptr + bytes) lies inside one shareable device segment, else 0.
  int (*shared_memory_lookup)(const void* ptr, uint64_t bytes, NpudistSharedRef* ref);

  // Description of the calling thread's last failure (never null).
  const char* (*last_error)(void);

  // --- Devices ---
  // Parses the device environment (NPUDIST_DEVICE_COUNT, ASCEND_RT_VISIBLE_DEVICES, NPUDIST_DEVICE_MEMORY).
  npudist_status (*validate_config)(void);
  int (*device_count)(void);  // 0 when the configuration is invalid
  int (*get_device)(void);    // the calling thread's current device
  npudist_status (*set_device)(int device);
  npudist_status (*get_device_properties)(int device, NpudistDeviceProperties* props);
  npudist_status (*device_synchronize)(int device);  // every stream of the device
  int (*is_initialized)(void);                       // 1 once a device was used in this process
  void (*mark_initialized)(void);

  // --- Memory ---
  // A segment of device memory, shareable with peer processes where possible (see shared_memory_lookup).
  npudist_status (*malloc)(int device, uint64_t bytes, void** ptr);
  npudist_status (*free)(void* ptr, uint64_t bytes);
  // Virtual address space for a segment that grows in place: reserve, then map/unmap physical pages in
  // granularity-aligned ranges. Unmapped ranges stay reserved until release_address.
  npudist_status (*reserve_address)(uint64_t bytes, void** base);
  npudist_status (*release_address)(void* base, uint64_t bytes);
  npudist_status (*map_memory)(void* ptr, uint64_t bytes);
  npudist_status (*unmap_memory)(void* ptr, uint64_t bytes);
  // Synchronous copy / fill: they touch the bytes now, ordered after nothing (callers drain streams first).
  npudist_status (*memcpy)(void* dst, const void* src, uint64_t bytes, NpudistMemcpyKind kind);
  npudist_status (*memset)(void* dst, int value, uint64_t bytes);

  // --- Streams ---
  // A stream (aclrtCreateStream): a pooled id (priority < 0: high priority), holding one stream of the
  // device's budget until stream_destroy (NPUDIST_ERROR_NO_STREAM_RESOURCE when none is left).
  npudist_status (*stream_create)(int device, int priority, int64_t* stream);
  // Gives the stream back to the budget; pooled ids are reused by later stream_create calls.
  npudist_status (*stream_destroy)(int device, int64_t stream);
  int (*stream_priority)(int64_t stream);  // 0 or -1 (high)
  int64_t (*get_stream)(int device);       // the calling thread's current stream on `device`
  npudist_status (*set_stream)(int device, int64_t stream);

  // --- Events ---
  npudist_status (*event_create)(NpudistEvent* event);
  npudist_status (*event_destroy)(NpudistEvent event);
  // The event completes once the stream has run everything enqueued on it before this call.
  npudist_status (*event_record)(NpudistEvent event, int device, int64_t stream);
  int (*event_query)(NpudistEvent event);  // 1 if complete (or never recorded), else 0
  npudist_status (*event_synchronize)(NpudistEvent event);
  npudist_status (*event_elapsed_ms)(NpudistEvent start, NpudistEvent end, double* ms);

  void (*set_blocking_hooks)(npudist_before_block_fn before, npudist_after_block_fn after);

  // --- Version 4 ---
  // Work enqueued on `stream` after this call runs only after `event` completed; the host does not block
  // (aclrtStreamWaitEvent). An event never recorded is complete.
  npudist_status (*stream_wait_event)(NpudistEvent event, int device, int64_t stream);

  // --- Version 5 ---
  // Device memory a collective communicator holds outside the caching allocator (HCCL: 2 x HCCL_BUFFSIZE per
  // communicator, aclrtMalloc'ed by HCCL on Ascend). The emulated device accounts for it without mapping it:
  // the allocator's segments must fit beside it, and mem_get_info, npu-smi and out-of-memory messages count
  // it. `owner` describes the holder in messages. NPUDIST_ERROR_OUT_OF_MEMORY (last_error() says how much is
  // free and who holds what) when it does not fit on the device.
  npudist_status (*comm_buffer_charge)(int device, uint64_t bytes, const char* owner, uint64_t* handle);
  npudist_status (*comm_buffer_release)(uint64_t handle);  // an unknown handle is ignored
  uint64_t (*comm_buffer_bytes)(int device);               // held on `device` now (0 for a bad index)
  // Who holds them on `device` ("" when nothing), NUL-terminated into buf (truncated to len); returns the
  // length of the whole description.
  uint64_t (*comm_buffer_describe)(int device, char* buf, uint64_t len);

  // --- Version 6 ---
  // A stream of torch's pool (getStreamFromGlobalPool, torch.npu.Stream()): shared round robin, holds nothing.
  npudist_status (*stream_from_pool)(int device, int priority, int64_t* stream);
  // take != 0: `holder` holds one more stream of `device`'s budget (NPUDIST_ERROR_NO_STREAM_RESOURCE when
  // none is left); take == 0: gives one back. An Atlas A2 device has 1984 streams, the default stream and
  // torch's pool of 64 included.
  npudist_status (*stream_hold)(int device, const char* holder, int take);

  // --- Version 8 ---
  // 1 if a stream of `device` other than `stream` (-1: every stream counts) has work pending, 0 if none has,
  // -1 if the ids are invalid.
  int (*device_busy_besides)(int device, int64_t stream);
  // Blocks the calling thread (calling the blocking hooks) until nothing is pending on any stream of
  // `device`: 1 then. Gives up when no task of the device finished for `stall_ms` (the queued work waits for
  // something that does not come, such as the caller itself): 0 then. -1 if `device` is invalid.
  int (*device_drain)(int device, uint32_t stall_ms);
} NpudistRuntimeApi;

// The runtime linked into npudist._C (the emulated one). Never null.
const NpudistRuntimeApi* npudist_runtime_api(void);

#ifdef __cplusplus
}
#endif
