// The npu as a Kineto activity source: an IActivityProfiler registered through PyTorch's
// PrivateUse1ProfilerRegistry (torch/csrc/profiler/standalone/privateuse1_profiler.h). Kineto creates
// a session when torch.profiler asks for ProfilerActivity.NPU (PrivateUse1) activities, forwards the
// torch op correlation ids to it, and at the end asks it for its events. Kernels and copies become
// device activities (CONCURRENT_KERNEL / GPU_MEMCPY, which torch maps to the PrivateUse1 device type),
// linked to the torch op that launched them, so key_averages() reports npu device time per op and the
// Chrome trace has one track per npu stream.
// GenericTraceActivity::addMetadata formats with fmt, whose compiled part libtorch does not export:
// use fmt header-only (symbols stay local: the extension is built with -fvisibility=hidden).
#define FMT_HEADER_ONLY
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>

#include <map>
#include <set>

#include "profiler/profiler.h"

namespace npudist::profiler {
namespace {

using libkineto::ActivityType;

const std::set<ActivityType>& npu_activities() {
  static const std::set<ActivityType> kTypes = {ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY};
  return kTypes;
}

ActivityType activity_type(Kind k) {
  return k == Kind::kMemcpy ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL;
}

class NpuSession final : public libkineto::IActivityProfilerSession {
 public:
  ~NpuSession() override {
    // A session torn down without stop() (the profiler was abandoned) must not leave recording on.
    if (status_ == libkineto::TraceStatus::RECORDING) stop_recording(nullptr);
  }

  void start() override {
    start_recording();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    size_t dropped = 0;
    records_ = stop_recording(&dropped);
    if (dropped) {
      errors_.push_back("npudist: " + std::to_string(dropped) +
                        " npu events were dropped (the per-session buffer is full); profile fewer steps");
    }
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t /*start*/, int64_t /*end*/) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(0, 0, "npu", "");
    buffer_->gpuOpCount = static_cast<int>(records_.size());
    int64_t id = 0;
    for (Record& r : records_) {
      buffer_->emplace_activity(buffer_->span, activity_type(r.kind), r.name);
      libkineto::GenericTraceActivity& a = *buffer_->activities.back();
      a.startTime = r.start_ns;
      a.endTime = std::max(r.end_ns, r.start_ns + 1);  // a zero-length event would be dropped as empty
      a.id = ++id;
      a.device = r.device;
      a.resource = static_cast<int32_t>(r.stream);
      // correlationId() narrows to int32 on Kineto's side (cpuActivity takes int32_t).
      if (r.correlation) a.linked = linked(static_cast<int32_t>(r.correlation));
      for (auto& [k, v] : r.metadata) a.addMetadata(k, v);
      streams_[{r.device, r.stream}] |= r.kind == Kind::kCollective;
      a.log(logger);
    }
    records_.clear();
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // Kineto takes one device per session; a rank drives one npu, the first one seen is named here
    // (events of other devices still get their own pid).
    if (streams_.empty()) return nullptr;
    const int device = streams_.begin()->first.first;
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, device + kSortAfterCpu, "npu:" + std::to_string(device), "NPU " + std::to_string(device)});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [key, has_comm] : streams_) {
      const auto [device, stream] = key;
      std::string name = "npu:" + std::to_string(device) + " stream " + std::to_string(stream);
      if (stream == 0) name += " (default)";
      if (has_comm) name += " (hccl)";
      out.push_back(libkineto::ResourceInfo{stream, stream, device, name});
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { push_correlation(id); }
  void popCorrelationId() override { pop_correlation(); }

 private:
  static constexpr int64_t kSortAfterCpu = 0x1000000;  // device tracks below the process's CPU tracks
  std::vector<Record> records_;
  std::vector<std::string> errors_;
  std::map<std::pair<int, int64_t>, bool> streams_;  // (device, stream) -> ran a collective
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class NpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return npu_activities(); }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    for (ActivityType t : npu_activities()) {
      if (types.count(t)) return std::make_unique<NpuSession>();
    }
    return nullptr;  // CPU-only profiling: record nothing on the device
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"npudist_npu"};
};

}  // namespace
}  // namespace npudist::profiler

using NpudistNpuActivityProfiler = npudist::profiler::NpuActivityProfiler;
REGISTER_PRIVATEUSE1_PROFILER(NpudistNpuActivityProfiler);
