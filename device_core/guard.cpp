// DeviceGuardImpl for PrivateUse1 (npu): current device, streams and events on top of the runtime.
// Only c10 headers (no ATen), so this file compiles quickly.
//
// Events are the runtime's events. `block` (Stream.wait_event / wait_stream) makes the stream's queue wait
// for the event without blocking the host (cudaStreamWaitEvent); with ASCEND_LAUNCH_BLOCKING=1 it blocks the
// host as before. Synchronizations raise a kernel error recorded by an earlier queued kernel (launch.h).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <stdexcept>

#include "graph/graph_capture.h"
#include "allocator/npu_allocator.h"
#include "launch/launch.h"
#include "npu_runtime.h"

namespace npudist {
namespace {

constexpr auto kNpu = c10::DeviceType::PrivateUse1;

c10::DeviceIndex checked_index(c10::Device d) {
  TORCH_CHECK_VALUE(d.type() == kNpu, "expected an npu device, got ", d);
  int idx = d.has_index() ? d.index() : rt::current_device();
  int n = rt::device_count();
  TORCH_CHECK_VALUE(idx >= 0 && idx < n, "Invalid npu device index ", idx, ": this process sees ", n,
                    " npu device(s) (set by NPUDIST_DEVICE_COUNT and ASCEND_RT_VISIBLE_DEVICES)");
  return static_cast<c10::DeviceIndex>(idx);
}

c10::Stream make_stream(c10::DeviceIndex idx, int64_t id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNpu, idx), id);
}

// A runtime call on a user-given stream: a bad stream id is a ValueError naming it.
void check_value(npudist_status s) {
  if (s == NPUDIST_ERROR_INVALID_DEVICE) TORCH_CHECK_VALUE(false, rt::api().last_error());
  rt::check(s);
}

int64_t new_stream(c10::DeviceIndex idx, int priority) {
  int64_t id = 0;
  rt::check(rt::api().stream_from_pool(idx, priority, &id));
  return id;
}

struct NpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::DeviceIndex idx = checked_index(d);
    int old = rt::current_device();
    if (old != idx) rt::set_device(idx);
    else rt::api().mark_initialized();
    return c10::Device(kNpu, static_cast<c10::DeviceIndex>(old));
  }
  c10::Device getDevice() const override {
    return c10::Device(kNpu, static_cast<c10::DeviceIndex>(rt::current_device()));
  }
  void setDevice(c10::Device d) const override { rt::set_device(checked_index(d)); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { (void)rt::api().set_device(d.index()); }

  c10::Stream getStream(c10::Device d) const override {
    c10::DeviceIndex idx = checked_index(d);
    return make_stream(idx, rt::api().get_stream(idx));
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return make_stream(checked_index(d), 0); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    c10::DeviceIndex idx = checked_index(d);
    return make_stream(idx, new_stream(idx, high_priority ? -1 : 0));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    c10::DeviceIndex idx = checked_index(d);
    return make_stream(idx, new_stream(idx, priority < 0 ? -1 : 0));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::DeviceIndex idx = checked_index(s.device());
    c10::Stream old = make_stream(idx, rt::api().get_stream(idx));
    check_value(rt::api().set_stream(idx, s.id()));
    return old;
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(rt::device_count());
  }

  // The event handle torch stores is the runtime's NpudistEvent, created on first record.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                device_index, " does not match recording stream's device index ", stream.device_index());
    c10::DeviceIndex idx = checked_index(stream.device());
    if (!*event) {
      NpudistEvent e = nullptr;
      rt::check(rt::api().event_create(&e));
      *event = e;
    }
    check_value(rt::api().event_record(static_cast<NpudistEvent>(*event), idx, stream.id()));
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (!event) return;
    if (launch::blocking()) {
      rt::check(rt::api().event_synchronize(static_cast<NpudistEvent>(event)));
      return;
    }
    check_value(rt::api().stream_wait_event(static_cast<NpudistEvent>(event), checked_index(stream.device()),
                                            stream.id()));
  }
  bool queryEvent(void* event) const override {
    return rt::api().event_query(static_cast<NpudistEvent>(event)) != 0;
  }
  void synchronizeEvent(void* event) const override {
    if (graph::any_capture_active()) graph::check_not_capturing("Event.synchronize()");
    if (event) rt::check(rt::api().event_synchronize(static_cast<NpudistEvent>(event)));
    launch::after_sync();
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    (void)rt::api().event_destroy(static_cast<NpudistEvent>(event));
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    double ms = 0;
    npudist_status s = rt::api().event_elapsed_ms(static_cast<NpudistEvent>(start), static_cast<NpudistEvent>(end), &ms);
    TORCH_CHECK_VALUE(s != NPUDIST_ERROR_NOT_READY, rt::api().last_error());
    rt::check(s);
    return ms;
  }

  bool queryStream(const c10::Stream& s) const override {
    c10::DeviceIndex idx = checked_index(s.device());
    int idle = rt::api().stream_query(idx, s.id());
    TORCH_CHECK_VALUE(idle >= 0, rt::api().last_error());
    return idle != 0;
  }
  void synchronizeStream(const c10::Stream& s) const override {
    if (graph::any_capture_active()) graph::check_not_capturing("Stream.synchronize()");
    check_value(rt::api().stream_synchronize(checked_index(s.device()), s.id()));
    launch::after_sync();
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    if (graph::any_capture_active()) graph::check_not_capturing("torch.npu.synchronize()");
    rt::check(rt::api().device_synchronize(checked_index(c10::Device(kNpu, device_index))));
    launch::after_sync();
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    memory::record_stream(data_ptr, stream);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

}  // namespace

// torch.Event.elapsed_time only accepts exact torch.Event objects; torch.npu.Event (a subclass) measures
// through this, given the events' ids (the NpudistEvent handles torch.Event.event_id reports).
double event_elapsed_ms(void* start, void* end) {
  return NpuGuardImpl().elapsedTime(start, end, -1);
}
}  // namespace npudist
