// libascendcl.so of npudist's emulated CANN home: initialisation, errors, devices. The ACL calls run on the
// device runtime table of the npudist._C loaded in the process, the same table torch's npu device uses,
// so ACL and torch see one set of devices, one current device per thread, one memory and one set of streams.
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include "acl_internal.h"
#include "acl_stream_handle.h"

namespace npudist::acl {
namespace {

thread_local std::string tls_error;
thread_local bool tls_has_error = false;
std::atomic<const NpudistRuntimeApi*> g_runtime{nullptr};
std::atomic<const NpudistLaunchApi*> g_launch{nullptr};
std::atomic<bool> g_initialized{false};

// Python loads extensions RTLD_LOCAL, so npudist._C's symbols are not global: find the loaded object by its
// path and look the table up in it (RTLD_NOLOAD: never load it here, it needs Python and torch).
int find_npudist_core(struct dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  if (!name || !std::strstr(name, "/npudist/_C.")) return 0;
  *static_cast<std::string*>(out) = name;
  return 1;
}

// The runtime table (and, when present, the launch table) of the loaded npudist._C.
const NpudistRuntimeApi* lookup_runtime() {
  std::string path;
  dl_iterate_phdr(&find_npudist_core, &path);
  if (path.empty()) return nullptr;
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) return nullptr;
  using RuntimeGetter = const NpudistRuntimeApi* (*)();
  using LaunchGetter = const NpudistLaunchApi* (*)();
  auto get = reinterpret_cast<RuntimeGetter>(dlsym(handle, "npudist_runtime_api"));
  auto get_launch = reinterpret_cast<LaunchGetter>(dlsym(handle, "npudist_launch_api"));
  dlclose(handle);  // drops only the reference RTLD_NOLOAD took; the extension stays loaded
  const NpudistLaunchApi* launch = get_launch ? get_launch() : nullptr;
  if (launch && launch->version >= 2) g_launch.store(launch, std::memory_order_release);
  return get ? get() : nullptr;
}

}  // namespace

bool launch_blocking() {
  const NpudistLaunchApi* launch = g_launch.load(std::memory_order_acquire);
  return launch && !launch->launches_async();
}

aclError fail(aclError code, const std::string& message) {
  tls_error = message;
  tls_has_error = true;
  return code;
}

const NpudistRuntimeApi* runtime() {
  const NpudistRuntimeApi* rt = g_runtime.load(std::memory_order_acquire);
  if (rt) return rt;
  rt = lookup_runtime();
  if (!rt) {
    fail(ACL_ERROR_UNINITIALIZE,
         "npudist's emulated ACL runtime runs on the npu device of npudist, which is not loaded in this process: "
         "import torch_npu (or torch, with npudist installed) before calling ACL");
    return nullptr;
  }
  if (rt->version < 4) {
    fail(ACL_ERROR_UNINITIALIZE, "the loaded npudist device runtime table is version " +
                                     std::to_string(rt->version) + "; this libascendcl.so needs 4 or newer: "
                                     "rebuild npudist (scripts/setup.sh)");
    return nullptr;
  }
  g_runtime.store(rt, std::memory_order_release);
  return rt;
}

aclError from_status(const NpudistRuntimeApi* rt, npudist_status status, const char* call) {
  if (status == NPUDIST_SUCCESS) return ACL_SUCCESS;
  aclError code = ACL_ERROR_RT_INTERNAL_ERROR;
  switch (status) {
    case NPUDIST_ERROR_INVALID_VALUE: code = ACL_ERROR_RT_PARAM_INVALID; break;
    case NPUDIST_ERROR_INVALID_DEVICE: code = ACL_ERROR_RT_INVALID_DEVICEID; break;
    case NPUDIST_ERROR_OUT_OF_MEMORY: code = ACL_ERROR_RT_MEMORY_ALLOCATION; break;
    case NPUDIST_ERROR_NOT_READY: code = ACL_ERROR_RT_EVENT_NOT_COMPLETE; break;
    case NPUDIST_ERROR_NO_STREAM_RESOURCE: code = ACL_ERROR_RT_NO_STREAM_RESOURCE; break;
    default: break;
  }
  return fail(code, std::string(call) + ": " + rt->last_error());
}

bool resolve_stream(const NpudistRuntimeApi* rt, aclrtStream stream, const char* call, int32_t* device,
                    int64_t* id) {
  if (!stream) {
    *device = rt->get_device();
    *id = 0;
    return true;
  }
  char buf[160];
  if (!decode_stream(stream, device, id)) {
    std::snprintf(buf, sizeof(buf), "%s: %p is not a stream handle (from aclrtCreateStream or torch_npu)", call,
                  stream);
    fail(ACL_ERROR_INVALID_PARAM, buf);
    return false;
  }
  if (*device >= rt->device_count() || rt->stream_query(*device, *id) < 0) {
    std::snprintf(buf, sizeof(buf), "%s: stream handle %p names device %d stream %lld, which does not exist",
                  call, stream, *device, static_cast<long long>(*id));
    fail(ACL_ERROR_INVALID_PARAM, buf);
    return false;
  }
  return true;
}

}  // namespace npudist::acl

using npudist::acl::fail;
using npudist::acl::from_status;

extern "C" {

const char* aclGetRecentErrMsg(void) {
  thread_local std::string returned;  // stays valid until the thread's next call
  if (!npudist::acl::tls_has_error) return nullptr;
  returned = npudist::acl::tls_error;
  npudist::acl::tls_has_error = false;
  return returned.c_str();
}

aclError aclInit(const char* configPath) {
  if (configPath && *configPath && access(configPath, R_OK) != 0) {
    return fail(ACL_ERROR_INVALID_FILE, std::string("aclInit: cannot read the config file '") + configPath + "'");
  }
  if (npudist::acl::g_initialized.exchange(true)) {
    return fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit: ACL is already initialized (aclFinalize first)");
  }
  return ACL_SUCCESS;
}

aclError aclFinalize(void) {
  if (!npudist::acl::g_initialized.exchange(false)) {
    return fail(ACL_ERROR_REPEAT_FINALIZE, "aclFinalize: ACL is not initialized (aclInit was not called)");
  }
  return ACL_SUCCESS;
}

aclError aclrtSetDevice(int32_t deviceId) {
  ACL_RUNTIME_OR_RETURN(rt);
  return from_status(rt, rt->set_device(deviceId), "aclrtSetDevice");
}

// Releases nothing (the device belongs to the process's npu runtime, which torch keeps using): waits for
// the device's work, as a reset does before tearing down.
aclError aclrtResetDevice(int32_t deviceId) {
  ACL_RUNTIME_OR_RETURN(rt);
  return from_status(rt, rt->device_synchronize(deviceId), "aclrtResetDevice");
}

aclError aclrtGetDevice(int32_t* deviceId) {
  if (!deviceId) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId is null");
  ACL_RUNTIME_OR_RETURN(rt);
  *deviceId = rt->get_device();
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceCount(uint32_t* count) {
  if (!count) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: count is null");
  ACL_RUNTIME_OR_RETURN(rt);
  npudist_status s = rt->validate_config();
  if (s != NPUDIST_SUCCESS) return from_status(rt, s, "aclrtGetDeviceCount");
  *count = static_cast<uint32_t>(rt->device_count());
  return ACL_SUCCESS;
}

aclError aclrtGetRunMode(aclrtRunMode* runMode) {
  if (!runMode) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetRunMode: runMode is null");
  *runMode = ACL_HOST;  // the program runs on the host and drives the device, as with torch_npu
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeDevice(void) {
  ACL_RUNTIME_OR_RETURN(rt);
  return from_status(rt, rt->device_synchronize(rt->get_device()), "aclrtSynchronizeDevice");
}

const char* aclrtGetSocName(void) { return "NpudistEmulatedNPU"; }

}  // extern "C"
