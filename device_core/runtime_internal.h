// device_core-internal additions to the runtime contract (npudist/runtime.h): configuration parsing,
// setters, stream pool, event timing, the C function table. Torch-free.
#pragma once
#include <string>

#include "npudist/runtime.h"
#include "npudist/runtime_c_api.h"

namespace npudist::runtime {

constexpr int kMaxDevices = 64;
// Stream ids per device: 0 = default stream, 1..kPoolSize low priority, kPoolSize+1..2*kPoolSize high.
constexpr int64_t kPoolSize = 32;
constexpr int64_t kStreamsPerDevice = 1 + 2 * kPoolSize;

// Throws std::invalid_argument naming the variable when the environment is malformed.
void validate_config();
size_t parse_size(const std::string& raw, const char* var);
// Throws std::out_of_range for an index outside 0..device_count()-1.
void check_device(int device);
void check_stream(int64_t stream);
int physical_device(int device);

void set_current_device(int device);
void set_current_stream(int device, int64_t stream);
bool is_initialized();
void mark_initialized();

int64_t pool_stream(int device, bool high_priority);
int stream_priority(int64_t stream);

bool stream_query(int device, int64_t stream);
void stream_synchronize(int device, int64_t stream);
void device_synchronize(int device);
double marker_elapsed_ms(const MarkerPtr& start, const MarkerPtr& end);

const NpudistRuntimeApi* c_api();

// Called around every blocking wait on a marker: module.cpp releases the Python GIL if the waiting
// thread holds it (torch.Event.wait / Stream.synchronize do not release it themselves).
struct BlockingHooks {
  void* (*before)() = nullptr;
  void (*after)(void* token) = nullptr;
};
void set_blocking_hooks(BlockingHooks hooks);

}  // namespace npudist::runtime
