// Example ACL extension: torch operators whose npu kernels call the ACL runtime of the CANN home
// ($ASCEND_HOME_PATH/include/acl, lib64/libascendcl.so) on torch's current npu stream, as Ascend extensions do.
// Built by run.py with torch.utils.cpp_extension; registration headers only (no torch/extension.h): faster.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <torch/library.h>

#include <acl/acl.h>

#include "torch_npu/csrc/core/npu/NPUStream.h"

#include <atomic>
#include <cstring>

namespace {

// An ACL failure as a torch error carrying the ACL code and aclGetRecentErrMsg.
void check_acl(aclError err, const char* call) {
  if (err == ACL_SUCCESS) return;
  const char* msg = aclGetRecentErrMsg();
  TORCH_CHECK(false, "aclops: ", call, " failed with ACL error ", err, ": ", msg ? msg : "(no message)");
}

// dst[:] = src, a device-to-device aclrtMemcpyAsync on the caller's current npu stream: ordered after the torch
// kernels queued there before (the producer of src) and before those queued after (the consumers of dst).
// destMax is dst's size, so a dst smaller than src is ACL's ACL_ERROR_INVALID_PARAM.
void copy_into(const at::Tensor& dst, const at::Tensor& src) {
  npudist::check_npu(dst, "aclops::copy_into", "dst");
  npudist::check_npu(src, "aclops::copy_into", "src");
  TORCH_CHECK(dst.is_contiguous() && src.is_contiguous(), "aclops::copy_into: contiguous tensors expected");
  npudist::NPUGuard guard(src.device());
  aclrtStream stream = c10_npu::getCurrentNPUStream().stream();
  check_acl(aclrtMemcpyAsync(dst.data_ptr(), dst.nbytes(), src.data_ptr(), src.nbytes(),
                             ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
            "aclrtMemcpyAsync");
}

at::Tensor copy(const at::Tensor& src) {
  at::Tensor out = at::empty_like(src);
  copy_into(out, src);
  return out;
}

// A float tensor of `n` copies of `value` in memory from aclrtMalloc (not the caching allocator): the host
// buffer is staged with aclrtMemcpyAsync and released by a host function on the same stream once the copy ran.
struct Staging {
  void* host;
  static void release(void* arg) {
    auto* s = static_cast<Staging*>(arg);
    aclrtFreeHost(s->host);
    delete s;
  }
};

at::Tensor acl_full(int64_t n, double value, int64_t device) {
  TORCH_CHECK(n > 0, "aclops::acl_full: n must be positive, got ", n);
  // The guard restores the caller's device on return; aclrtSetDevice switches this thread (torch's current
  // device too: one runtime) and rejects a bad index with ACL's code.
  npudist::NPUGuard guard(c10::Device(c10::DeviceType::PrivateUse1, npudist::current_device()));
  check_acl(aclrtSetDevice(static_cast<int32_t>(device)), "aclrtSetDevice");
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  void* dev = nullptr;
  check_acl(aclrtMalloc(&dev, bytes, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc");
  auto* staging = new Staging{nullptr};
  check_acl(aclrtMallocHost(&staging->host, bytes), "aclrtMallocHost");
  float* h = static_cast<float*>(staging->host);
  for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>(value);
  aclrtStream stream = c10_npu::getCurrentNPUStream().stream();
  check_acl(aclrtMemcpyAsync(dev, bytes, staging->host, bytes, ACL_MEMCPY_HOST_TO_DEVICE, stream), "aclrtMemcpyAsync");
  check_acl(aclrtLaunchCallback(&Staging::release, staging, ACL_CALLBACK_BLOCK, stream), "aclrtLaunchCallback");
  // The storage's deleter returns the block to ACL. It runs when the last reference goes, which npudist's
  // queued kernels hold until they ran, so no queued work still reads the block.
  const c10::Device npu(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  return at::from_blob(dev, {n}, [](void* p) { aclrtFree(p); }, at::TensorOptions().dtype(at::kFloat).device(npu),
                       npu);
}

// How many host functions ran: aclrtLaunchHostFunc on the current stream, in order with torch kernels.
std::atomic<int64_t> g_ticks{0};

int64_t tick() {
  check_acl(aclrtLaunchHostFunc(c10_npu::getCurrentNPUStream().stream(), [](void*) { g_ticks.fetch_add(1); },
                                nullptr),
            "aclrtLaunchHostFunc");
  return g_ticks.load();
}

int64_t ticks() { return g_ticks.load(); }

// An ACL call on a handle that is not a stream: the error comes back as ACL's code and message.
void sync_bad_stream() {
  check_acl(aclrtSynchronizeStream(reinterpret_cast<aclrtStream>(static_cast<uintptr_t>(0x1234))),
            "aclrtSynchronizeStream");
}

}  // namespace

TORCH_LIBRARY(aclops, m) {
  m.def("copy(Tensor src) -> Tensor");
  m.def("copy_into(Tensor(a!) dst, Tensor src) -> ()");
  m.def("acl_full(int n, float value, int device) -> Tensor", &acl_full);
  m.def("tick() -> int", &tick);
  m.def("ticks() -> int", &ticks);
  m.def("sync_bad_stream() -> ()", &sync_bad_stream);
}

TORCH_LIBRARY_IMPL(aclops, PrivateUse1, m) {
  m.impl("copy", &copy);
  m.impl("copy_into", &copy_into);
}
