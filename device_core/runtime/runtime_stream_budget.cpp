// The device's stream budget (runtime_internal.h). Plain C++: the counts behind CANN's "no stream resource".
#include <map>
#include <mutex>
#include <string>

#include "runtime/runtime_internal.h"

namespace npudist::runtime {
namespace {

std::mutex g_mu;
std::map<std::string, int64_t> g_held[kMaxDevices];  // holder -> streams held, per device

int64_t held_locked(int device) {
  int64_t n = 0;
  for (const auto& [holder, count] : g_held[device]) n += count;
  return n;
}

}  // namespace

bool stream_budget_take(int device, const std::string& holder, std::string* why) {
  check_device(device);
  std::lock_guard<std::mutex> g(g_mu);
  const int64_t held = held_locked(device);
  if (kStreamsPerDevice + held >= kStreamBudget) {
    std::string parts;
    for (const auto& [h, count] : g_held[device]) {
      if (count) parts += ", " + std::to_string(count) + " by " + h;
    }
    *why = "npu:" + std::to_string(device) + " has no stream left for " + holder +
           " (ACL_ERROR_RT_NO_STREAM_RESOURCE, error code 207008; EL0009: the stream resources are insufficient): "
           "the emulated Atlas A2 device has " + std::to_string(kStreamBudget) + " streams, 1 default + " +
           std::to_string(kStreamsPerDevice - 1) + " in torch's stream pool + " + std::to_string(held) + " held" +
           parts + ". Destroy streams no longer used (aclrtDestroyStream, acl.rt.destroy_stream) and reset or "
           "delete NPUGraphs no longer replayed (NPUGraph.reset()).";
    return false;
  }
  ++g_held[device][holder];
  return true;
}

void stream_budget_give(int device, const std::string& holder) {
  if (device < 0 || device >= kMaxDevices) return;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_held[device].find(holder);
  if (it != g_held[device].end() && it->second > 0) --it->second;
}

}  // namespace npudist::runtime
