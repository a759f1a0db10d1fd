// The device memory an hccl communicator holds, with CANN's accounting: HCCL allocates 2 x HCCL_BUFFSIZE
// (send and receive buffers) on the device for every communicator, so on Ascend many process groups leave
// less room for tensors. The charge goes to the device runtime (runtime_c_api.h, comm_buffer_*), which makes
// the caching allocator, mem_get_info, npu-smi and out-of-memory messages count it; nothing is mapped (the
// engine's real staging buffers are small and live in shared memory). As torch_npu creates an HCCL
// communicator for a device when a group first runs an op on that device's tensors (or at once for
// init_process_group(device_id=...)), the charge is made then, once per device, and released with the group.
#include <c10/util/Exception.h>

#include <cstdio>

#include "internal.h"
#include "process_group_hccl.h"

namespace npudist::hccl {

namespace {

std::string megabytes(size_t bytes) { return std::to_string(bytes >> 20) + " MB"; }

}  // namespace

void ProcessGroupHCCL::charge_device_buffers(int device) {
  const NpudistRuntimeApi* api = runtime_api();
  if (!api || device < 0 || device >= 64) return;
  std::lock_guard<std::mutex> g(charge_mu_);
  if (charged_mask_.load() & (uint64_t{1} << device)) return;
  const size_t bytes = device_buffer_bytes();
  const std::string owner =
      c10::str("hccl communicator (2 x ", buffer_source_, "=", megabytes(hccl_buffer_bytes_), ")");
  uint64_t handle = 0;
  if (api->comm_buffer_charge(device, bytes, owner.c_str(), &handle) != NPUDIST_SUCCESS) {
    const std::string why = api->last_error();
    TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory: the hccl communicator of group '",
                     options_->group_name, "' (rank ", rank_, " of ", size_, ") needs ",
                     bytes / 1048576.0, " MiB on npu:", device, " for its buffers (2 x ", buffer_source_, "=",
                     megabytes(hccl_buffer_bytes_), ", as CANN allocates them for every communicator), but ",
                     why, ". Lower ", buffer_source_,
                     " (HCCL_BUFFSIZE for every group, hccl_config={'hccl_buffer_size': MB} for one) or create "
                     "fewer process groups.");
  }
  charges_.emplace_back(device, handle);
  charged_mask_.fetch_or(uint64_t{1} << device);
}

void ProcessGroupHCCL::release_device_buffers() {
  const NpudistRuntimeApi* api = runtime_api();
  std::lock_guard<std::mutex> g(charge_mu_);
  if (api) {
    for (const auto& [device, handle] : charges_) api->comm_buffer_release(handle);
  }
  charges_.clear();
  charged_mask_ = 0;
}

std::vector<int> ProcessGroupHCCL::charged_devices() {
  std::lock_guard<std::mutex> g(charge_mu_);
  std::vector<int> out;
  for (const auto& c : charges_) out.push_back(c.first);
  return out;
}

void ProcessGroupHCCL::eagerConnectSingleDevice(at::Device device) {
  if (device.type() == c10::DeviceType::PrivateUse1 && device.has_index()) charge_device_buffers(device.index());
}

}  // namespace npudist::hccl
