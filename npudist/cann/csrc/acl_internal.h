// Private to libascendcl.so (npudist/cann/csrc/acl_*.cpp): the device runtime table it runs on, error
// reporting, stream handles. Plain C++ over npudist/runtime_c_api.h; no torch.
#pragma once
#include <string>

#include "acl/acl.h"
#include "npudist/launch_c_api.h"
#include "npudist/runtime_c_api.h"

namespace npudist::acl {

// The runtime table of the npudist._C loaded in this process, or null (and the thread's error message set)
// when npudist's npu device is not loaded.
const NpudistRuntimeApi* runtime();

// True under blocking launch (ASCEND_LAUNCH_BLOCKING=1): torch kernels then run inline on the calling thread
// without draining streams, so an ACL call queued on a stream must complete before it returns to stay in
// order with them (as every launch is synchronous in that mode).
bool launch_blocking();

// Records `message` as the thread's recent error (aclGetRecentErrMsg) and returns `code`.
aclError fail(aclError code, const std::string& message);
// A runtime status as an ACL error code, with the runtime's message prefixed by the ACL call's name.
aclError from_status(const NpudistRuntimeApi* rt, npudist_status status, const char* call);

// (device, stream id) of an aclrtStream; null is the current device's default stream. On a bad handle
// returns false with the error recorded.
bool resolve_stream(const NpudistRuntimeApi* rt, aclrtStream stream, const char* call, int32_t* device,
                    int64_t* id);

// The shape of every call on a stream: resolve the handle, run f(rt, device, stream id) -> npudist_status,
// report its status as an ACL error named after `call`.
template <class F>
aclError on_stream(aclrtStream stream, const char* call, F&& f) {
  const NpudistRuntimeApi* rt = runtime();
  if (!rt) return ACL_ERROR_UNINITIALIZE;
  int32_t device;
  int64_t id;
  if (!resolve_stream(rt, stream, call, &device, &id)) return ACL_ERROR_INVALID_PARAM;
  npudist_status s = f(rt, device, id);
  if (s == NPUDIST_SUCCESS && launch_blocking()) s = rt->stream_synchronize(device, id);
  return from_status(rt, s, call);
}

}  // namespace npudist::acl

// Every ACL entry point starts with this: the runtime or the ACL error saying how to get one.
#define ACL_RUNTIME_OR_RETURN(rt)                           \
  const NpudistRuntimeApi* rt = ::npudist::acl::runtime();  \
  if (!rt) return ACL_ERROR_UNINITIALIZE
