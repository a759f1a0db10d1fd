// The emulated runtime behind the C ABI (npudist/runtime_c_api.h): every entry catches the C++ runtime's
// exceptions and turns them into a status code plus a per-thread message.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "runtime/runtime_internal.h"

struct NpudistEvent_ {
  std::mutex mu;  // record may race with query/synchronize from other threads
  npudist::runtime::MarkerPtr marker;

  npudist::runtime::MarkerPtr get() {
    std::lock_guard<std::mutex> g(mu);
    return marker;
  }
};

namespace npudist::runtime {
namespace {

thread_local std::string tls_error;

npudist_status fail(npudist_status code, const std::string& what) {
  tls_error = what;
  return code;
}

// Runs f, mapping the runtime's exceptions to status codes (out_of_range: a bad device/stream index).
template <class F>
npudist_status guarded(F&& f) {
  try {
    f();
    return NPUDIST_SUCCESS;
  } catch (const std::out_of_range& e) {
    return fail(NPUDIST_ERROR_INVALID_DEVICE, e.what());
  } catch (const std::invalid_argument& e) {
    return fail(NPUDIST_ERROR_INVALID_VALUE, e.what());
  } catch (const std::bad_alloc&) {
    return fail(NPUDIST_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(NPUDIST_ERROR_INTERNAL, e.what());
  }
}

const char* c_last_error() { return tls_error.c_str(); }

// ---- devices
npudist_status c_validate_config() { return guarded([] { validate_config(); }); }
int c_device_count() { return device_count(); }
int c_get_device() { return current_device(); }
npudist_status c_set_device(int d) { return guarded([&] { set_current_device(d); }); }
npudist_status c_get_device_properties(int d, NpudistDeviceProperties* props) {
  if (!props) return fail(NPUDIST_ERROR_INVALID_VALUE, "get_device_properties: props is null");
  return guarded([&] {
    NpudistDeviceProperties p{};
    std::strncpy(p.name, "npudist emulated NPU", sizeof(p.name) - 1);
    p.total_memory = device_capacity(d);
    p.physical_index = physical_device(d);
    *props = p;
  });
}
npudist_status c_device_synchronize(int d) { return guarded([&] { device_synchronize(d); }); }
int c_is_initialized() { return is_initialized() ? 1 : 0; }
void c_mark_initialized() { mark_initialized(); }

// ---- memory
npudist_status c_malloc(int device, uint64_t bytes, void** ptr) {
  if (!ptr) return fail(NPUDIST_ERROR_INVALID_VALUE, "malloc: ptr is null");
  return guarded([&] {
    check_device(device);
    *ptr = map_fixed_segment(bytes);
    if (!*ptr) throw std::bad_alloc();
    usage_segment_allocated(device, *ptr, bytes);
  });
}
npudist_status c_free(void* ptr, uint64_t bytes) {
  if (ptr) {
    usage_segment_freed(ptr);
    unmap_fixed_segment(ptr, bytes);
  }
  return NPUDIST_SUCCESS;
}
npudist_status c_reserve_address(uint64_t bytes, void** base) {
  if (!base) return fail(NPUDIST_ERROR_INVALID_VALUE, "reserve_address: base is null");
  *base = reserve_address(bytes);
  if (!*base) return fail(NPUDIST_ERROR_OUT_OF_MEMORY, "cannot reserve address space");
  usage_reserved(*base, bytes);
  return NPUDIST_SUCCESS;
}
npudist_status c_release_address(void* base, uint64_t bytes) {
  if (base) {
    usage_released(base);
    release_address(base, bytes);
  }
  return NPUDIST_SUCCESS;
}
npudist_status c_map_memory(void* ptr, uint64_t bytes) {
  if (!commit_pages(ptr, bytes)) return fail(NPUDIST_ERROR_OUT_OF_MEMORY, "cannot map device pages");
  usage_pages(ptr, bytes, true);
  return NPUDIST_SUCCESS;
}
npudist_status c_unmap_memory(void* ptr, uint64_t bytes) {
  decommit_pages(ptr, bytes);
  usage_pages(ptr, bytes, false);
  return NPUDIST_SUCCESS;
}
npudist_status c_memcpy(void* dst, const void* src, uint64_t bytes, NpudistMemcpyKind kind) {
  if (kind < NPUDIST_MEMCPY_HOST_TO_HOST || kind > NPUDIST_MEMCPY_DEVICE_TO_DEVICE) {
    return fail(NPUDIST_ERROR_INVALID_VALUE, "memcpy: unknown copy kind " + std::to_string(kind));
  }
  if (bytes && (!dst || !src)) return fail(NPUDIST_ERROR_INVALID_VALUE, "memcpy: null pointer");
  // HOST-MEMORY: every kind is one host memcpy; a real device uses aclrtMemcpy(Async) with the kind.
  if (bytes) std::memmove(dst, src, bytes);
  return NPUDIST_SUCCESS;
}
npudist_status c_memset(void* dst, int value, uint64_t bytes) {
  if (bytes && !dst) return fail(NPUDIST_ERROR_INVALID_VALUE, "memset: null pointer");
  // HOST-MEMORY: a host memset; a real device uses aclrtMemset.
  if (bytes) std::memset(dst, value, bytes);
  return NPUDIST_SUCCESS;
}

// ---- streams
npudist_status c_launch(int device, int64_t stream, npudist_host_fn fn, void* arg) {
  return guarded([&] { launch_host_func(device, stream, fn, arg); });
}
npudist_status c_stream_sync(int device, int64_t stream) {
  return guarded([&] { stream_synchronize(device, stream); });
}
int c_stream_query(int device, int64_t stream) {
  int idle = 0;
  npudist_status s = guarded([&] { idle = stream_query(device, stream) ? 1 : 0; });
  return s == NPUDIST_SUCCESS ? idle : -1;
}
int c_shared_lookup(const void* ptr, uint64_t bytes, NpudistSharedRef* ref) {
  return ref && lookup_shared_segment(ptr, bytes, ref) ? 1 : 0;
}
npudist_status c_stream_hold(int device, const char* holder, int take) {
  const std::string who = holder && *holder ? holder : "an unnamed holder";
  std::string why;
  bool ok = true;
  npudist_status s = guarded([&] {
    if (take) ok = stream_budget_take(device, who, &why);
    else stream_budget_give(device, who);
  });
  if (s != NPUDIST_SUCCESS) return s;
  return ok ? NPUDIST_SUCCESS : fail(NPUDIST_ERROR_NO_STREAM_RESOURCE, why);
}
npudist_status c_stream_from_pool(int device, int priority, int64_t* stream) {
  if (!stream) return fail(NPUDIST_ERROR_INVALID_VALUE, "stream_from_pool: stream is null");
  return guarded([&] { *stream = pool_stream(device, priority < 0); });
}
constexpr const char* kCreatedStream = "aclrtCreateStream (not destroyed)";
npudist_status c_stream_create(int device, int priority, int64_t* stream) {
  if (!stream) return fail(NPUDIST_ERROR_INVALID_VALUE, "stream_create: stream is null");
  if (npudist_status s = c_stream_hold(device, kCreatedStream, 1)) return s;
  return c_stream_from_pool(device, priority, stream);
}
// Pooled ids are shared round-robin by every caller, so only the budget's count goes back: destroying
// the same handle twice gives back two.
npudist_status c_stream_destroy(int device, int64_t stream) {
  npudist_status s = guarded([&] {
    check_device(device);
    check_stream(stream);
  });
  if (s != NPUDIST_SUCCESS) return s;
  return c_stream_hold(device, kCreatedStream, 0);
}
int c_stream_priority(int64_t stream) { return stream_priority(stream); }
int64_t c_get_stream(int device) {
  int64_t s = 0;
  guarded([&] {
    check_device(device);
    s = current_stream(device);
  });
  return s;
}
npudist_status c_set_stream(int device, int64_t stream) {
  return guarded([&] { set_current_stream(device, stream); });
}

// ---- events
npudist_status c_event_create(NpudistEvent* event) {
  if (!event) return fail(NPUDIST_ERROR_INVALID_VALUE, "event_create: event is null");
  return guarded([&] { *event = new NpudistEvent_(); });
}
npudist_status c_event_destroy(NpudistEvent event) {
  delete event;
  return NPUDIST_SUCCESS;
}
npudist_status c_event_record(NpudistEvent event, int device, int64_t stream) {
  if (!event) return fail(NPUDIST_ERROR_INVALID_VALUE, "event_record: event is null");
  return guarded([&] {
    MarkerPtr m = record_marker(device, stream);
    std::lock_guard<std::mutex> g(event->mu);
    event->marker = std::move(m);
  });
}
int c_event_query(NpudistEvent event) { return !event || marker_done(event->get()) ? 1 : 0; }
npudist_status c_event_synchronize(NpudistEvent event) {
  return guarded([&] {
    if (event) marker_wait(event->get());
  });
}
npudist_status c_stream_wait_event(NpudistEvent event, int device, int64_t stream) {
  return guarded([&] {
    check_device(device);
    check_stream(stream);
    if (event) stream_wait_marker(device, stream, event->get());
  });
}
npudist_status c_event_elapsed_ms(NpudistEvent start, NpudistEvent end, double* ms) {
  if (!ms) return fail(NPUDIST_ERROR_INVALID_VALUE, "event_elapsed_ms: ms is null");
  if (!start || !end) return fail(NPUDIST_ERROR_NOT_READY, "elapsed_time: both events must have been recorded");
  npudist_status s = guarded([&] { *ms = marker_elapsed_ms(start->get(), end->get()); });
  return s == NPUDIST_ERROR_INVALID_VALUE ? NPUDIST_ERROR_NOT_READY : s;
}

// ---- communication buffers
npudist_status c_comm_buffer_charge(int device, uint64_t bytes, const char* owner, uint64_t* handle) {
  if (!handle) return fail(NPUDIST_ERROR_INVALID_VALUE, "comm_buffer_charge: handle is null");
  std::string why;
  npudist_status s = guarded([&] { *handle = comm_buffer_charge(device, bytes, owner ? owner : "", &why); });
  if (s != NPUDIST_SUCCESS) return s;
  return *handle ? NPUDIST_SUCCESS : fail(NPUDIST_ERROR_OUT_OF_MEMORY, why);
}
npudist_status c_comm_buffer_release(uint64_t handle) {
  comm_buffer_release(handle);
  return NPUDIST_SUCCESS;
}
uint64_t c_comm_buffer_bytes(int device) { return comm_buffer_bytes(device); }
uint64_t c_comm_buffer_describe(int device, char* buf, uint64_t len) {
  const std::string d = comm_buffer_describe(device);
  if (buf && len) {
    const size_t n = std::min<size_t>(d.size(), len - 1);
    std::memcpy(buf, d.data(), n);
    buf[n] = '\0';
  }
  return d.size();
}

int c_device_busy_besides(int device, int64_t stream) {
  int busy = 0;
  npudist_status s = guarded([&] { busy = device_busy_besides(device, stream) ? 1 : 0; });
  return s == NPUDIST_SUCCESS ? busy : -1;
}
int c_device_drain(int device, uint32_t stall_ms) {
  int drained = 0;
  npudist_status s = guarded([&] { drained = device_drain(device, std::chrono::milliseconds(stall_ms)) ? 1 : 0; });
  return s == NPUDIST_SUCCESS ? drained : -1;
}

void c_set_blocking_hooks(npudist_before_block_fn before, npudist_after_block_fn after) {
  set_blocking_hooks(BlockingHooks{before, after});
}

const NpudistRuntimeApi g_api = {
    NPUDIST_RUNTIME_API_VERSION,
    &c_launch,
    &c_stream_sync,
    &c_stream_query,
    &c_shared_lookup,
    &c_last_error,
    &c_validate_config,
    &c_device_count,
    &c_get_device,
    &c_set_device,
    &c_get_device_properties,
    &c_device_synchronize,
    &c_is_initialized,
    &c_mark_initialized,
    &c_malloc,
    &c_free,
    &c_reserve_address,
    &c_release_address,
    &c_map_memory,
    &c_unmap_memory,
    &c_memcpy,
    &c_memset,
    &c_stream_create,
    &c_stream_destroy,
    &c_stream_priority,
    &c_get_stream,
    &c_set_stream,
    &c_event_create,
    &c_event_destroy,
    &c_event_record,
    &c_event_query,
    &c_event_synchronize,
    &c_event_elapsed_ms,
    &c_set_blocking_hooks,
    &c_stream_wait_event,
    &c_comm_buffer_charge,
    &c_comm_buffer_release,
    &c_comm_buffer_bytes,
    &c_comm_buffer_describe,
    &c_stream_from_pool,
    &c_stream_hold,
    &c_device_busy_besides,
    &c_device_drain,
};

}  // namespace
}  // namespace npudist::runtime

// Exported (the extension is built -fvisibility=hidden) so that the emulated libascendcl.so, a plain C++
// library loaded by other extensions, finds the same table inside the loaded npudist._C (npudist/cann).
extern "C" __attribute__((visibility("default"))) const NpudistRuntimeApi* npudist_runtime_api(void) { return &npudist::runtime::g_api; }
