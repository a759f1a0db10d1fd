// libtorch_npu.so (installed as torch_npu/lib/libtorch_npu.so): what extensions that link `-ltorch_npu`
// (DeepSpeed's NPU op builders, Ascend samples) resolve against. torch_npu's own C++ API is torch code and
// lives in npudist._C and <npudist/extension.h>; this library carries the part of torch_npu an ACL program
// needs from torch: the aclrtStream of a torch npu stream (torch.npu.Stream's (device_index, stream_id)),
// the handle torch_npu's NPUStream::stream() returns. It links libascendcl.so, as Ascend's does, so loading
// it makes the ACL runtime available to extensions loaded later.
#include <stdint.h>

#include "acl/acl.h"
#include "acl_stream_handle.h"

extern "C" {

__attribute__((visibility("default"))) aclrtStream torch_npu_acl_stream(int32_t device_index, int64_t stream_id) {
  return npudist::acl::encode_stream(device_index, stream_id);
}

// 0 and (device_index, stream_id) filled for a stream handle; ACL_ERROR_INVALID_PARAM otherwise.
__attribute__((visibility("default"))) int torch_npu_stream_of(aclrtStream stream, int32_t* device_index,
                                                               int64_t* stream_id) {
  if (!device_index || !stream_id) return ACL_ERROR_INVALID_PARAM;
  return npudist::acl::decode_stream(stream, device_index, stream_id) ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}

// Keeps the DT_NEEDED entry on libascendcl.so (the linker drops unused libraries with --as-needed).
__attribute__((visibility("default"))) const char* torch_npu_soc_name(void) { return aclrtGetSocName(); }

}  // extern "C"
