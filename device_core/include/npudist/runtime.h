// npudist device runtime: the torch-free C++ surface of the emulated NPU that other parts of
// device_core (the caching allocator) build on. Implemented in device_core/ (streams, devices).
//
// Model: compute is host-synchronous (like ASCEND_LAUNCH_BLOCKING=1). A stream additionally owns an
// in-order queue of *host functions* that other components (the hccl backend) enqueue; those run
// asynchronously on the stream's worker thread. A marker recorded on a stream is done once every host
// function enqueued on that stream before it has run (immediately, if the queue is empty).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace npudist::runtime {

// Visible devices in this process (NPUDIST_DEVICE_COUNT filtered by ASCEND_RT_VISIBLE_DEVICES).
int device_count();
// Per-device memory capacity in bytes (NPUDIST_DEVICE_MEMORY, an accounting limit).
size_t device_capacity(int device);

// The calling thread's current device (torch.npu.current_device()).
int current_device();

// Stream ids are c10::StreamId values; 0 is the default stream of a device.
int64_t current_stream(int device);

struct Marker;  // opaque
using MarkerPtr = std::shared_ptr<Marker>;
MarkerPtr record_marker(int device, int64_t stream);
bool marker_done(const MarkerPtr& m);
void marker_wait(const MarkerPtr& m);  // blocks the calling thread (spin -> yield -> sleep)

// Enqueue fn(arg) to run after all work previously enqueued on (device, stream). fn must not throw.
void launch_host_func(int device, int64_t stream, void (*fn)(void*), void* arg);

}  // namespace npudist::runtime
