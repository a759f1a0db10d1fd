// The emulated runtime's C++ internals (torch-free), shared by runtime.cpp (devices, streams, markers),
// runtime_memory.cpp (device memory on host mappings) and runtime_c_api.cpp (the C table). Nothing outside
// the runtime includes this: the allocator and the aten glue use npudist/runtime_c_api.h.
//
// Model: a stream owns an in-order queue of *host functions* (the glue's queued kernels, hccl's gates and
// fences); they run asynchronously on the stream's worker thread. A marker recorded on a stream is done once every host
// function enqueued on that stream before it has run (immediately, if the queue is empty).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "npudist/runtime_c_api.h"

namespace npudist::runtime {

constexpr int kMaxDevices = NPUDIST_MAX_DEVICES;
// Stream ids per device: 0 = default stream, 1..kPoolSize low priority, kPoolSize+1..2*kPoolSize high.
constexpr int64_t kPoolSize = 32;
constexpr int64_t kStreamsPerDevice = 1 + 2 * kPoolSize;
// Above torch's pool: the sync-launch pool, then torch.npu.graph's default capture stream (runtime_c_api.h). Ids
// 0..kStreamIds-1 are valid; the budget counts only torch's pool, as the streams above it are shared by the process.
static_assert(NPUDIST_SYNC_LAUNCH_STREAM_FIRST == kStreamsPerDevice, "sync-launch ids follow torch's pool");
static_assert(NPUDIST_GRAPH_CAPTURE_STREAM == kStreamsPerDevice + NPUDIST_SYNC_LAUNCH_STREAMS,
              "the capture stream follows the sync-launch pool");
constexpr int64_t kStreamIds = NPUDIST_STREAM_IDS;
// Streams an Atlas A2 device has (aclrtCreateStream's documented maximum, the default stream included).
// The ids above stay pooled; the budget counts who holds a stream (runtime_stream_budget.cpp).
constexpr int64_t kStreamBudget = 1984;

// Throws std::invalid_argument naming the variable when the environment is malformed.
void validate_config();
size_t parse_size(const std::string& raw, const char* var);
// Visible devices in this process (NPUDIST_DEVICE_COUNT filtered by ASCEND_RT_VISIBLE_DEVICES).
int device_count();
// Per-device memory capacity in bytes (NPUDIST_DEVICE_MEMORY, an accounting limit).
size_t device_capacity(int device);
// Throws std::out_of_range for an index outside 0..device_count()-1.
void check_device(int device);
void check_stream(int64_t stream);
int physical_device(int device);

int current_device();
void set_current_device(int device);
int64_t current_stream(int device);
void set_current_stream(int device, int64_t stream);
bool is_initialized();
void mark_initialized();

int64_t pool_stream(int device, bool high_priority);
int stream_priority(int64_t stream);

struct Marker;  // opaque
using MarkerPtr = std::shared_ptr<Marker>;
MarkerPtr record_marker(int device, int64_t stream);
bool marker_done(const MarkerPtr& m);
void marker_wait(const MarkerPtr& m);  // blocks the calling thread (spin -> yield -> sleep)
double marker_elapsed_ms(const MarkerPtr& start, const MarkerPtr& end);

// Enqueue fn(arg) to run after all work previously enqueued on (device, stream). fn must not throw.
void launch_host_func(int device, int64_t stream, void (*fn)(void*), void* arg);
// Work enqueued on (device, stream) after this call runs only once marker `m` is done (no host block).
void stream_wait_marker(int device, int64_t stream, const MarkerPtr& m);
bool stream_query(int device, int64_t stream);
void stream_synchronize(int device, int64_t stream);
void device_synchronize(int device);
// True when a stream of `device` other than `stream` (-1: none excepted) has work pending.
bool device_busy_besides(int device, int64_t stream);
// Blocks (with the blocking hooks) until nothing is pending on any stream of `device`; gives up, returning
// false, once no task of the device finished for `stall` (its queued work waits for something that does not
// come, e.g. the blocked caller itself).
bool device_drain(int device, std::chrono::milliseconds stall);

// Called around every blocking wait on a marker (the Python extension releases the GIL there).
struct BlockingHooks {
  void* (*before)() = nullptr;
  void (*after)(void* token) = nullptr;
};
void set_blocking_hooks(BlockingHooks hooks);

// ---- Device memory (runtime_memory.cpp): page-aligned host mappings ----
// Fixed segments are shared mappings of a memfd (unless NPUDIST_SHARED_DEVICE_MEMORY=0 or memfd_create
// fails, e.g. out of file descriptors: then private anonymous memory). Peers of the hccl engine on the same
// host map them and read/write tensors in place, which makes large collectives on npu tensors one copy
// per byte instead of two (as CUDA IPC does for NCCL). A forked child gets private copy-on-write views of
// them, so npu memory behaves across fork as anonymous memory does. nullptr when the host refuses.
void* map_fixed_segment(size_t size);
void unmap_fixed_segment(void* ptr, size_t size);
// True (and *ref filled) if [ptr, ptr + bytes) lies inside one shareable fixed segment.
bool lookup_shared_segment(const void* ptr, size_t bytes, NpudistSharedRef* ref);
// Address space without memory (nullptr on failure); pages are committed/decommitted inside it.
void* reserve_address(size_t size);
void release_address(void* base, size_t size);
bool commit_pages(void* ptr, size_t size);
void decommit_pages(void* ptr, size_t size);

// ---- Usage record for npu-smi (runtime_usage.cpp): device memory held per device, by segment events ----
void usage_segment_allocated(int device, void* ptr, size_t bytes);
void usage_segment_freed(void* ptr);
void usage_reserved(void* base, size_t bytes);
void usage_released(void* base);
void usage_pages(void* ptr, size_t bytes, bool mapped);
// Memory charged without a mapping (communication buffers), counted in the record like segments.
void usage_charged(int device, int64_t delta);
// Device memory this process holds on `device`: segments, mapped pages and charges.
size_t usage_device_bytes(int device);

// ---- Communication buffers (runtime_comm_buffers.cpp): device memory collective communicators hold outside
// the caching allocator, accounted without a mapping ----
// A handle (> 0), or 0 with *why set when `bytes` does not fit beside what the process holds on `device`.
uint64_t comm_buffer_charge(int device, size_t bytes, const std::string& owner, std::string* why);
void comm_buffer_release(uint64_t handle);
size_t comm_buffer_bytes(int device);
// "<n> x <owner>: <bytes>" per distinct owner, joined by "; " ("" when nothing is held).
std::string comm_buffer_describe(int device);

// ---- Stream budget (runtime_stream_budget.cpp): streams held beyond the default stream and torch's pool,
// per holder ("aclrtCreateStream (not destroyed)", "captured NPUGraphs (not reset)"). Hardware runs out of
// streams; the emulated pool never would, so a stream leak is counted here to fail where it fails on a device. ----
// False with *why set (CANN's code and the counts) when `device` has no stream left.
bool stream_budget_take(int device, const std::string& holder, std::string* why);
void stream_budget_give(int device, const std::string& holder);  // a holder with none held is ignored

}  // namespace npudist::runtime
