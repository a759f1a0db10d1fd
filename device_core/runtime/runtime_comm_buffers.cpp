// Communication buffers: device memory that collective communicators hold outside the caching allocator.
// On Ascend, HCCL allocates 2 x HCCL_BUFFSIZE of device memory per communicator (send and receive buffers)
// with aclrtMalloc, so a job with many process groups has less room for tensors. The emulated device keeps
// the same books without mapping anything (the hccl engine's real staging buffers are smaller and live in
// shared memory): a charge counts against the device's capacity, is seen by the caching allocator (its
// segments must fit beside the charges), torch.npu.mem_get_info, npu-smi (the usage record) and the
// out-of-memory messages, and is released when the communicator goes away.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/runtime_internal.h"

namespace npudist::runtime {
namespace {

struct Charge {
  int device;
  size_t bytes;
  std::string owner;
  pid_t pid;  // a forked child inherits the parent's charges but not the memory they account for
};

std::mutex g_mu;
std::map<uint64_t, Charge> g_charges;  // by handle
uint64_t g_next_handle = 1;

std::string format_size(size_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes < (size_t(1) << 20)) {
    std::snprintf(buf, sizeof(buf), "%.2f KiB", b / 1024.0);
  } else if (bytes < (size_t(1) << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / 1048576.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / 1073741824.0);
  }
  return buf;
}

size_t charged_locked(int device) {
  size_t n = 0;
  const pid_t me = getpid();
  for (const auto& [h, c] : g_charges) n += c.device == device && c.pid == me ? c.bytes : 0;
  return n;
}

std::string describe_locked(int device) {
  // Owners in first-charged order, with how many charges each holds and their total.
  std::vector<std::pair<std::string, std::pair<int, size_t>>> owners;
  const pid_t me = getpid();
  for (const auto& [h, c] : g_charges) {
    if (c.device != device || c.pid != me) continue;
    auto it = owners.begin();
    while (it != owners.end() && it->first != c.owner) ++it;
    if (it == owners.end()) {
      owners.push_back({c.owner, {1, c.bytes}});
    } else {
      it->second.first += 1;
      it->second.second += c.bytes;
    }
  }
  std::string out;
  for (const auto& [owner, n] : owners) {
    out += (out.empty() ? "" : "; ") + std::to_string(n.first) + " x " + owner + ": " + format_size(n.second);
  }
  return out;
}

}  // namespace

uint64_t comm_buffer_charge(int device, size_t bytes, const std::string& owner, std::string* why) {
  check_device(device);
  std::lock_guard<std::mutex> g(g_mu);
  const size_t capacity = device_capacity(device);
  const size_t held = usage_device_bytes(device);
  if (held > capacity || bytes > capacity - held) {
    if (why) {
      const size_t charged = charged_locked(device);
      const std::string others = describe_locked(device);
      *why = "npu:" + std::to_string(device) + " has a total capacity of " + format_size(capacity) + " of which " +
             format_size(held > capacity ? 0 : capacity - held) + " is free; this process holds " +
             format_size(held - std::min(held, charged)) + " in tensor segments and other device memory" +
             (others.empty() ? std::string() : " and " + format_size(charged) + " in communication buffers (" +
                                                   others + ")");
    }
    return 0;
  }
  const uint64_t handle = g_next_handle++;
  g_charges[handle] = Charge{device, bytes, owner, getpid()};
  usage_charged(device, static_cast<int64_t>(bytes));
  return handle;
}

void comm_buffer_release(uint64_t handle) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_charges.find(handle);
  if (it == g_charges.end()) return;
  if (it->second.pid == getpid()) usage_charged(it->second.device, -static_cast<int64_t>(it->second.bytes));
  g_charges.erase(it);
}

size_t comm_buffer_bytes(int device) {
  std::lock_guard<std::mutex> g(g_mu);
  return charged_locked(device);
}

std::string comm_buffer_describe(int device) {
  std::lock_guard<std::mutex> g(g_mu);
  return describe_locked(device);
}

}  // namespace npudist::runtime
