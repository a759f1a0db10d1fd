// npu device activity for torch.profiler (docs/debugging.md, "Profiling").
//
// Device-side events (kernels the zero-copy fallback runs, copies, hccl collectives) are recorded here
// while a Kineto PrivateUse1 session is active (profiler_kineto.cpp registers it with PyTorch's
// PrivateUse1ProfilerRegistry); the session hands them to Kineto, which merges them with the CPU ops.
// When no session is active every hook costs one relaxed atomic load.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "npudist/profiler_c_api.h"

namespace c10 { class OperatorHandle; }
namespace at { class Tensor; }
namespace pybind11 { class module_; }

namespace npudist::profiler {

enum class Kind : uint8_t { kKernel, kMemcpy, kCollective };

struct Record {
  Kind kind;
  std::string name;
  int device;
  int64_t stream;
  int64_t start_ns, end_ns;
  uint64_t correlation;  // torch op correlation id (0: none)
  std::vector<std::pair<std::string, std::string>> metadata;  // (key, JSON value)
};

// Nonzero while a session records. Defined in profiler_record.cpp.
extern std::atomic<int> g_active;

inline bool active() { return g_active.load(std::memory_order_relaxed) != 0; }

// Session control (profiler_kineto.cpp): start clears the buffer and turns recording on; stop turns it
// off and returns what was recorded plus how many records were dropped because the buffer was full.
void start_recording();
std::vector<Record> stop_recording(size_t* dropped);

// Correlation ids Kineto pushes around every profiled torch op on the calling thread.
void push_correlation(uint64_t id);
void pop_correlation();
uint64_t current_correlation();

int64_t now_ns();

// One device kernel: constructed right before the kernel runs on the calling thread, destroyed after.
class KernelScope {
 public:
  KernelScope(const c10::OperatorHandle& op, int device) {
    if (active()) begin(op, device);
  }
  ~KernelScope() {
    if (start_ns_) end();
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  void begin(const c10::OperatorHandle& op, int device);
  void end();
  const c10::OperatorHandle* op_ = nullptr;
  int device_ = -1;
  int64_t stream_ = 0;
  uint64_t correlation_ = 0;
  int64_t start_ns_ = 0;
};

// A copy between devices (host<->npu, npu<->npu), recorded as a memcpy activity.
class CopyScope {
 public:
  CopyScope(const at::Tensor& src, const at::Tensor& dst) {
    if (active()) begin(src, dst);
  }
  ~CopyScope() {
    if (start_ns_) end();
  }
  CopyScope(const CopyScope&) = delete;
  CopyScope& operator=(const CopyScope&) = delete;

 private:
  void begin(const at::Tensor& src, const at::Tensor& dst);
  void end();
  const char* name_ = nullptr;
  int device_ = -1;
  int64_t stream_ = 0;
  int64_t bytes_ = 0;
  uint64_t correlation_ = 0;
  int64_t start_ns_ = 0;
};

// Allocator hooks: report an npu allocation / free to torch's memory profiler (profile_memory=True)
// through c10::reportMemoryUsageToProfiler, as CUDA's allocator does. Only allocations made while
// memory profiling is on are tracked, so their frees can be reported with their size.
void report_alloc(void* ptr, size_t bytes, int device);
void report_free(void* ptr);

// The C table for npudist.hccl._C and the Python binding that hands it over.
const NpudistProfilerApi* c_api();
void init_bindings(pybind11::module_& m);

}  // namespace npudist::profiler
