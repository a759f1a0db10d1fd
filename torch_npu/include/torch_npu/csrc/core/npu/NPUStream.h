// torch_npu's C++ stream API (c10_npu::NPUStream, getCurrentNPUStream) for extensions that call ACL on torch's
// npu streams: `c10_npu::getCurrentNPUStream().stream()` is the aclrtStream of the caller's current npu stream,
// so an aclrtMemcpyAsync / aclrtLaunchCallback on it runs in order with the torch kernels queued there.
// Build with the include directories $ASCEND_HOME_PATH/include, <torch_npu>/include and
// npudist.cpp_extension.include_paths(), and link -lascendcl -ltorch_npu (docs/cann.md).
#pragma once
#include <stdint.h>

#include <acl/acl_rt.h>
#include <npudist/extension.h>

extern "C" {
// libtorch_npu.so: the aclrtStream of torch npu stream (device_index, stream_id) and back (0 = ACL_SUCCESS).
aclrtStream torch_npu_acl_stream(int32_t device_index, int64_t stream_id);
int torch_npu_stream_of(aclrtStream stream, int32_t* device_index, int64_t* stream_id);
}

namespace c10_npu {

class NPUStream {
 public:
  explicit NPUStream(c10::Stream stream) : stream_(stream) {}
  c10::Stream unwrap() const { return stream_; }
  c10::DeviceIndex device_index() const { return stream_.device_index(); }
  c10::StreamId id() const { return stream_.id(); }
  aclrtStream stream() const { return torch_npu_acl_stream(stream_.device_index(), stream_.id()); }
  operator aclrtStream() const { return stream(); }

 private:
  c10::Stream stream_;
};

inline NPUStream getCurrentNPUStream(c10::DeviceIndex device_index = -1) {
  return NPUStream(npudist::getCurrentNPUStream(device_index));
}

}  // namespace c10_npu
