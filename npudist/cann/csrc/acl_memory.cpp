// libascendcl.so: device and host memory, copies and fills. Device memory comes from the runtime table's
// malloc (the same segments the caching allocator gets), so it is npu memory to torch and counted by
// npu-smi; a copy on a stream is a host function queued behind the stream's earlier work (torch's queued
// kernels included).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>
#include <unordered_set>

#include "acl_internal.h"
#include "npudist/runtime_usage.h"

using npudist::acl::fail;
using npudist::acl::from_status;

namespace {

std::mutex g_mu;
std::unordered_map<void*, size_t> g_device_blocks;  // aclrtMalloc'ed pointer -> bytes
std::unordered_set<void*> g_host_blocks;            // aclrtMallocHost'ed pointers
std::map<uintptr_t, std::pair<size_t, uint32_t>> g_registered;  // aclrtHostRegisterV2: base -> (size, flag)

// Device memory this process holds on a physical device: its npu-smi usage record (runtime_usage.cpp).
uint64_t used_on(int physical) {
  char path[96];
  std::snprintf(path, sizeof(path), "/dev/shm/" NPUDIST_USAGE_PREFIX "%d", static_cast<int>(getpid()));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;  // nothing allocated yet
  NpudistUsageRecord r{};
  ssize_t n = pread(fd, &r, sizeof(r), 0);
  close(fd);
  if (n != static_cast<ssize_t>(sizeof(r)) || physical < 0 || physical >= 64) return 0;
  return r.used_bytes[physical];
}

const char* kind_name(aclrtMemcpyKind kind) {
  switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST: return "ACL_MEMCPY_HOST_TO_HOST";
    case ACL_MEMCPY_HOST_TO_DEVICE: return "ACL_MEMCPY_HOST_TO_DEVICE";
    case ACL_MEMCPY_DEVICE_TO_HOST: return "ACL_MEMCPY_DEVICE_TO_HOST";
    case ACL_MEMCPY_DEVICE_TO_DEVICE: return "ACL_MEMCPY_DEVICE_TO_DEVICE";
  }
  return nullptr;
}

aclError check_copy(const char* call, void* dst, size_t destMax, const void* src, size_t count,
                    aclrtMemcpyKind kind) {
  char buf[200];
  if (!kind_name(kind)) {
    std::snprintf(buf, sizeof(buf), "%s: unknown aclrtMemcpyKind %d", call, static_cast<int>(kind));
    return fail(ACL_ERROR_INVALID_PARAM, buf);
  }
  if (count > destMax) {
    std::snprintf(buf, sizeof(buf), "%s: count %zu exceeds destMax %zu", call, count, destMax);
    return fail(ACL_ERROR_INVALID_PARAM, buf);
  }
  if (count && (!dst || !src)) {
    std::snprintf(buf, sizeof(buf), "%s: null %s pointer", call, dst ? "source" : "destination");
    return fail(ACL_ERROR_INVALID_PARAM, buf);
  }
  return ACL_SUCCESS;
}

struct CopyTask {
  const NpudistRuntimeApi* rt;
  void* dst;
  const void* src;
  size_t count;
  int kind;  // NpudistMemcpyKind, or -1 for a fill with `value`
  int value;
};

// Runs on the stream's worker. Arguments were checked at launch, so the table cannot fail here.
void run_copy(void* arg) {
  auto* t = static_cast<CopyTask*>(arg);
  if (t->kind < 0) {
    t->rt->memset(t->dst, t->value, t->count);
  } else {
    t->rt->memcpy(t->dst, t->src, t->count, static_cast<NpudistMemcpyKind>(t->kind));
  }
  delete t;
}

aclError launch_copy(aclrtStream stream, const char* call, const CopyTask& task) {
  auto* t = new (std::nothrow) CopyTask(task);
  if (!t) return fail(ACL_ERROR_BAD_ALLOC, std::string(call) + ": out of host memory");
  aclError e = npudist::acl::on_stream(stream, call, [&](const NpudistRuntimeApi* rt, int32_t device, int64_t id) {
    return rt->launch_host_func(device, id, &run_copy, t);
  });
  if (e != ACL_SUCCESS) delete t;  // not queued
  return e;
}

}  // namespace

extern "C" {

aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total) {
  if (!free || !total) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: free and total must not be null");
  ACL_RUNTIME_OR_RETURN(rt);
  NpudistDeviceProperties props;
  npudist_status s = rt->get_device_properties(rt->get_device(), &props);
  if (s != NPUDIST_SUCCESS) return from_status(rt, s, "aclrtGetMemInfo");
  if (attr == ACL_DDR_MEM || attr == ACL_DDR_MEM_HUGE || attr == ACL_DDR_MEM_NORMAL) {
    *free = *total = 0;  // the emulated device has HBM only (as Ascend 910's DDR query answers 0)
    return ACL_SUCCESS;
  }
  const uint64_t used = used_on(props.physical_index);
  *total = props.total_memory;
  *free = used >= props.total_memory ? 0 : props.total_memory - used;
  return ACL_SUCCESS;
}

aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy) {
  if (!devPtr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: devPtr is null");
  if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: size must be greater than 0");
  if (policy < ACL_MEM_MALLOC_HUGE_FIRST || policy > ACL_MEM_MALLOC_NORMAL_ONLY_P2P) {
    return fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: unknown aclrtMemMallocPolicy " + std::to_string(policy));
  }
  ACL_RUNTIME_OR_RETURN(rt);
  size_t free_bytes = 0, total = 0;
  aclError e = aclrtGetMemInfo(ACL_HBM_MEM, &free_bytes, &total);
  if (e != ACL_SUCCESS) return e;
  const int device = rt->get_device();
  if (size > free_bytes) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "aclrtMalloc: %zu bytes requested on device %d, %zu of %zu free", size,
                  device, free_bytes, total);
    return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, buf);
  }
  void* p = nullptr;
  npudist_status s = rt->malloc(device, size, &p);
  if (s != NPUDIST_SUCCESS) return from_status(rt, s, "aclrtMalloc");
  std::lock_guard<std::mutex> g(g_mu);
  g_device_blocks[p] = size;
  *devPtr = p;
  return ACL_SUCCESS;
}

aclError aclrtFree(void* devPtr) {
  ACL_RUNTIME_OR_RETURN(rt);
  size_t size = 0;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_device_blocks.find(devPtr);
    if (it == g_device_blocks.end()) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "aclrtFree: %p was not returned by aclrtMalloc (or is already freed)", devPtr);
      return fail(ACL_ERROR_INVALID_PARAM, buf);
    }
    size = it->second;
    g_device_blocks.erase(it);
  }
  return from_status(rt, rt->free(devPtr, size), "aclrtFree");
}

// Host memory: page-aligned, as pinned host memory is. The emulated device reads host memory directly, so
// there is nothing to pin.
aclError aclrtMallocHost(void** hostPtr, size_t size) {
  if (!hostPtr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: hostPtr is null");
  if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: size must be greater than 0");
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size) != 0) {
    return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMallocHost: out of host memory (" + std::to_string(size) +
                                                    " bytes)");
  }
  std::lock_guard<std::mutex> g(g_mu);
  g_host_blocks.insert(p);
  *hostPtr = p;
  return ACL_SUCCESS;
}

aclError aclrtFreeHost(void* hostPtr) {
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!g_host_blocks.erase(hostPtr)) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "aclrtFreeHost: %p was not returned by aclrtMallocHost (or is already freed)",
                    hostPtr);
      return fail(ACL_ERROR_INVALID_PARAM, buf);
    }
  }
  std::free(hostPtr);
  return ACL_SUCCESS;
}

aclError aclrtHostRegisterV2(void* ptr, uint64_t size, uint32_t flag) {
  char buf[200];
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  if (!ptr || size == 0) return fail(ACL_ERROR_INVALID_PARAM, "aclrtHostRegisterV2: null ptr or size 0");
  if (flag == 0 || (flag & ~(ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED))) {
    std::snprintf(buf, sizeof(buf),
                  "aclrtHostRegisterV2: unsupported flag 0x%x (ACL_HOST_REG_MAPPED, ACL_HOST_REG_PINNED)", flag);
    return fail(ACL_ERROR_INVALID_PARAM, buf);
  }
  if ((flag & ACL_HOST_REG_MAPPED) && (p % 4096 || size % 4096)) {
    std::snprintf(buf, sizeof(buf),
                  "aclrtHostRegisterV2: ACL_HOST_REG_MAPPED needs 4 KiB-aligned ptr and size (%p, %llu)", ptr,
                  static_cast<unsigned long long>(size));
    return fail(ACL_ERROR_INVALID_PARAM, buf);
  }
  std::lock_guard<std::mutex> g(g_mu);
  auto next = g_registered.lower_bound(p);
  const bool overlaps_next = next != g_registered.end() && next->first < p + size;
  const bool overlaps_prev = next != g_registered.begin() && std::prev(next)->first + std::prev(next)->second.first > p;
  if (overlaps_next || overlaps_prev) {
    std::snprintf(buf, sizeof(buf), "aclrtHostRegisterV2: [%p, +%llu) overlaps a registered range", ptr,
                  static_cast<unsigned long long>(size));
    return fail(ACL_ERROR_INVALID_PARAM, buf);
  }
  g_registered[p] = {size, flag};
  return ACL_SUCCESS;
}

aclError aclrtHostUnregister(void* ptr) {
  std::lock_guard<std::mutex> g(g_mu);
  if (!g_registered.erase(reinterpret_cast<uintptr_t>(ptr))) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "aclrtHostUnregister: %p is not the start of a registered range", ptr);
    return fail(ACL_ERROR_INVALID_PARAM, buf);
  }
  return ACL_SUCCESS;
}

aclError aclrtHostGetDevicePointer(void* pHost, void** pDevice, uint32_t flag) {
  if (!pDevice || flag != 0) {
    return fail(ACL_ERROR_INVALID_PARAM, "aclrtHostGetDevicePointer: pDevice null or flag not 0");
  }
  const auto p = reinterpret_cast<uintptr_t>(pHost);
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_registered.upper_bound(p);
  if (it == g_registered.begin() || p - std::prev(it)->first >= std::prev(it)->second.first ||
      !(std::prev(it)->second.second & ACL_HOST_REG_MAPPED)) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "aclrtHostGetDevicePointer: %p is not in a range registered ACL_HOST_REG_MAPPED",
                  pHost);
    return fail(ACL_ERROR_INVALID_PARAM, buf);
  }
  *pDevice = pHost;  // the emulated device addresses host memory directly
  return ACL_SUCCESS;
}

// Synchronous and, as on Ascend, not ordered with queued stream work: synchronize the stream that
// produces `src` first (aclrtSynchronizeStream, torch.npu.synchronize).
aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind) {
  aclError e = check_copy("aclrtMemcpy", dst, destMax, src, count, kind);
  if (e != ACL_SUCCESS) return e;
  ACL_RUNTIME_OR_RETURN(rt);
  return from_status(rt, rt->memcpy(dst, src, count, static_cast<NpudistMemcpyKind>(kind)), "aclrtMemcpy");
}

aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream) {
  aclError e = check_copy("aclrtMemcpyAsync", dst, destMax, src, count, kind);
  if (e != ACL_SUCCESS) return e;
  ACL_RUNTIME_OR_RETURN(rt);
  return launch_copy(stream, "aclrtMemcpyAsync", CopyTask{rt, dst, src, count, static_cast<int>(kind), 0});
}

aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value, size_t count) {
  if (count > maxCount) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: count exceeds maxCount");
  if (count && !devPtr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: devPtr is null");
  ACL_RUNTIME_OR_RETURN(rt);
  return from_status(rt, rt->memset(devPtr, value, count), "aclrtMemset");
}

aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream) {
  if (count > maxCount) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemsetAsync: count exceeds maxCount");
  if (count && !devPtr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemsetAsync: devPtr is null");
  ACL_RUNTIME_OR_RETURN(rt);
  return launch_copy(stream, "aclrtMemsetAsync", CopyTask{rt, devPtr, nullptr, count, -1, value});
}

}  // extern "C"
