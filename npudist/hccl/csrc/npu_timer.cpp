// DDP's compute and communication times on the npu: a c10d Timer for PrivateUse1 from npu events, registered
// as PyTorch registers CudaTimer (torch/csrc/distributed/c10d/reducer_cuda.cpp). DDP's Reducer looks the
// timer up by its parameters' device type; without one its logger records no forward/backward times for an
// npu model. An npu event completes when the work queued before it on the stream has run, so the difference
// of two is the device-side time between them.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <optional>

namespace npudist::hccl {
namespace {

constexpr double kNanosPerMilli = 1e6;

class NpuTimer : public c10d::Timer {
 public:
  explicit NpuTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event);  // the host-side time (DDP's logger reports both)
    c10::DeviceGuard guard(device_);
    c10::impl::VirtualGuardImpl impl(device_.type());
    event_of(event).record(impl.getStream(device_));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::Event& first = event_of(start);
    c10::Event& last = event_of(end);
    // Events of a phase that did not run (no backward, no_sync()) were never recorded: nothing to measure.
    if (!first.was_marked_for_recording() || !last.was_marked_for_recording()) return std::nullopt;
    c10::DeviceGuard guard(device_);
    first.synchronize();
    last.synchronize();
    const double ms = first.elapsedTime(last);
    // An end recorded in an earlier iteration than its start (DDP under no_sync()): no valid interval.
    if (ms < 0) return std::nullopt;
    return static_cast<int64_t>(ms * kNanosPerMilli);
  }

 private:
  c10::Event& event_of(Event event) {
    switch (event) {
      case Event::kForwardStart: return forward_start_;
      case Event::kBackwardComputeStart: return backward_compute_start_;
      case Event::kBackwardComputeEnd: return backward_compute_end_;
      case Event::kBackwardCommStart: return backward_comm_start_;
      case Event::kBackwardCommEnd: return backward_comm_end_;
    }
    TORCH_INTERNAL_ASSERT(false, "unknown DDP timer event");
  }

  c10::Device device_;
  // BACKEND_DEFAULT: the device's timing event (every npu event carries its completion time).
  c10::Event forward_start_{c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event backward_compute_start_{c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event backward_compute_end_{c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event backward_comm_start_{c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event backward_comm_end_{c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT};
};

}  // namespace
}  // namespace npudist::hccl

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, npudist::hccl::NpuTimer)
}  // namespace c10d
