// DeviceGuardImpl for PrivateUse1 (npu): current device, streams and events on top of the runtime.
// Only c10 headers (no ATen), so this file compiles quickly.
//
// Events wrap runtime markers. Since compute is host-synchronous, `block` (Stream.wait_event) orders all
// later work after the event by blocking the host until the event's stream has passed it; work later
// enqueued on any stream is then necessarily behind it.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <stdexcept>

#include "allocator/npu_allocator.h"
#include "runtime_internal.h"

namespace npudist {
namespace {

namespace rt = runtime;
constexpr auto kNpu = c10::DeviceType::PrivateUse1;

struct EventState {
  rt::MarkerPtr marker;
  c10::DeviceIndex device = -1;
};

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

int64_t checked_stream_id(const c10::Stream& s) {
  TORCH_CHECK_VALUE(s.id() >= 0 && s.id() < rt::kStreamsPerDevice, "invalid npu stream id ", s.id());
  return s.id();
}

struct NpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::DeviceIndex idx = checked_index(d);
    int old = rt::current_device();
    if (old != idx) rt::set_current_device(idx);
    else rt::mark_initialized();
    return c10::Device(kNpu, static_cast<c10::DeviceIndex>(old));
  }
  c10::Device getDevice() const override {
    return c10::Device(kNpu, static_cast<c10::DeviceIndex>(rt::current_device()));
  }
  void setDevice(c10::Device d) const override { rt::set_current_device(checked_index(d)); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      rt::set_current_device(d.index());
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device d) const override {
    c10::DeviceIndex idx = checked_index(d);
    return make_stream(idx, rt::current_stream(idx));
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return make_stream(checked_index(d), 0); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    c10::DeviceIndex idx = checked_index(d);
    return make_stream(idx, rt::pool_stream(idx, high_priority));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    c10::DeviceIndex idx = checked_index(d);
    return make_stream(idx, rt::pool_stream(idx, priority < 0));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::DeviceIndex idx = checked_index(s.device());
    c10::Stream old = make_stream(idx, rt::current_stream(idx));
    rt::set_current_stream(idx, checked_stream_id(s));
    return old;
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(rt::device_count());
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                device_index, " does not match recording stream's device index ", stream.device_index());
    auto* e = static_cast<EventState*>(*event);
    if (!e) {
      e = new EventState();
      *event = e;
    }
    e->device = stream.device_index();
    e->marker = rt::record_marker(checked_index(stream.device()), checked_stream_id(stream));
  }
  void block(void* event, const c10::Stream& /*stream*/) const override {
    if (event) rt::marker_wait(static_cast<EventState*>(event)->marker);
  }
  bool queryEvent(void* event) const override {
    return !event || rt::marker_done(static_cast<EventState*>(event)->marker);
  }
  void synchronizeEvent(void* event) const override {
    if (event) rt::marker_wait(static_cast<EventState*>(event)->marker);
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<EventState*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK_VALUE(start && end, "elapsed_time: both events must have been recorded");
    try {
      return rt::marker_elapsed_ms(static_cast<EventState*>(start)->marker,
                                   static_cast<EventState*>(end)->marker);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  }

  bool queryStream(const c10::Stream& s) const override {
    return rt::stream_query(checked_index(s.device()), checked_stream_id(s));
  }
  void synchronizeStream(const c10::Stream& s) const override {
    rt::stream_synchronize(checked_index(s.device()), checked_stream_id(s));
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    rt::device_synchronize(checked_index(c10::Device(kNpu, device_index)));
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    memory::record_stream(data_ptr, stream);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

}  // namespace

// torch.Event.elapsed_time only accepts exact torch.Event objects; torch.npu.Event (a subclass) measures
// through this, given the events' ids (the EventState pointers torch.Event.event_id reports).
double event_elapsed_ms(void* start, void* end) {
  return NpuGuardImpl().elapsedTime(start, end, -1);
}
}  // namespace npudist
