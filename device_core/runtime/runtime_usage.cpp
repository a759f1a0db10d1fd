// Per-process device-memory usage record, read by `npu-smi` (npudist/cann/smi.py) in another process.
// A real driver knows every process's device memory; emulated devices are plain host mappings, so each
// process publishes its own: a small file in /dev/shm, mapped shared, created at the first device
// allocation, unlinked at exit. Only segment-level events (fixed segments allocated/freed, expandable pages
// mapped/unmapped) touch it, not tensor allocations, so the caching allocator's fast path pays nothing.
// Layout (native endian, version 1) in npudist/runtime_usage.h.
#include "runtime/runtime_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "npudist/runtime_usage.h"

namespace npudist::runtime {
namespace {

std::mutex g_mu;
NpudistUsageRecord* g_record = nullptr;  // null until the first allocation (or if /dev/shm is unusable)
bool g_tried = false;
char g_path[128];
std::map<uintptr_t, std::pair<int, size_t>> g_segments;      // fixed segment base -> (device, bytes)
std::map<uintptr_t, std::pair<int, size_t>> g_reservations;  // reserved range base -> (device, bytes)
int64_t g_used[kMaxDevices] = {};  // bytes held per device, kept even when the record cannot be created

void remove_record() {
  if (g_record) unlink(g_path);
}

void lock_for_fork() { g_mu.lock(); }
void unlock_after_fork() { g_mu.unlock(); }

// A forked child must not count its allocations in the parent's record: it starts without one. The lock is
// held across fork (prepare handlers run in reverse registration order: this one, registered at load, after
// the caching allocator's, which takes its locks before calling into the runtime).
void forget_record_in_child() {
  g_record = nullptr;
  g_tried = false;
  g_segments.clear();
  g_reservations.clear();
  std::memset(g_used, 0, sizeof(g_used));
  g_mu.unlock();
}

[[maybe_unused]] const int g_fork_handler = pthread_atfork(&lock_for_fork, &unlock_after_fork, &forget_record_in_child);

// Records of processes that no longer exist (killed before their exit handler ran): removed by the next
// process that creates its record, so /dev/shm does not accumulate them. A pid reused by a live process keeps
// its stale record until npu-smi, which checks the mapping, removes it.
void remove_dead_records() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  const size_t prefix_len = std::strlen(NPUDIST_USAGE_PREFIX);
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, NPUDIST_USAGE_PREFIX, prefix_len) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(e->d_name + prefix_len, &end, 10);
    if (pid <= 0 || *end != '\0' || kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    char path[300];
    std::snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
    unlink(path);
  }
  closedir(dir);
}

NpudistUsageRecord* record_locked() {
  if (g_record || g_tried) return g_record;
  g_tried = true;
  remove_dead_records();
  std::snprintf(g_path, sizeof(g_path), "/dev/shm/" NPUDIST_USAGE_PREFIX "%d", static_cast<int>(getpid()));
  int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;  // no /dev/shm: this process is simply not listed by npu-smi
  void* p = MAP_FAILED;
  if (ftruncate(fd, sizeof(NpudistUsageRecord)) == 0) {
    p = mmap(nullptr, sizeof(NpudistUsageRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (p == MAP_FAILED) {
    unlink(g_path);
    return nullptr;
  }
  auto* r = static_cast<NpudistUsageRecord*>(p);
  std::memset(r, 0, sizeof(*r));
  r->version = NPUDIST_USAGE_VERSION;
  r->pid = static_cast<int32_t>(getpid());
  for (int d = 0; d < device_count(); ++d) {
    const int phys = physical_device(d);
    if (phys >= 0 && phys < kMaxDevices) r->capacity_bytes[phys] = device_capacity(d);
  }
  std::atexit(&remove_record);
  std::memcpy(r->magic, NPUDIST_USAGE_MAGIC, sizeof(r->magic));  // last: a reader sees a complete header
  g_record = r;
  return r;
}

void add_locked(int device, int64_t delta) {
  if (device < 0 || device >= kMaxDevices) return;
  g_used[device] += delta;
  NpudistUsageRecord* r = record_locked();
  if (!r) return;
  const int phys = physical_device(device);
  if (phys < 0 || phys >= kMaxDevices) return;
  __atomic_add_fetch(&r->used_bytes[phys], static_cast<uint64_t>(delta), __ATOMIC_RELAXED);
}

// The reservation holding ptr, or end().
std::map<uintptr_t, std::pair<int, size_t>>::iterator find_reservation(const void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = g_reservations.upper_bound(p);
  if (it == g_reservations.begin()) return g_reservations.end();
  --it;
  return p - it->first < it->second.second ? it : g_reservations.end();
}

}  // namespace

void usage_segment_allocated(int device, void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> g(g_mu);
  g_segments[reinterpret_cast<uintptr_t>(ptr)] = {device, bytes};
  add_locked(device, static_cast<int64_t>(bytes));
}

void usage_segment_freed(void* ptr) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_segments.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_segments.end()) return;
  add_locked(it->second.first, -static_cast<int64_t>(it->second.second));
  g_segments.erase(it);
}

// The table's reserve_address takes no device: an expandable segment is charged to the device that is
// current on the reserving thread (the caching allocator grows a device's segment under its device guard).
void usage_reserved(void* base, size_t bytes) {
  std::lock_guard<std::mutex> g(g_mu);
  g_reservations[reinterpret_cast<uintptr_t>(base)] = {current_device(), bytes};
}

void usage_released(void* base) {
  std::lock_guard<std::mutex> g(g_mu);
  g_reservations.erase(reinterpret_cast<uintptr_t>(base));
}

void usage_charged(int device, int64_t delta) {
  std::lock_guard<std::mutex> g(g_mu);
  add_locked(device, delta);
}

size_t usage_device_bytes(int device) {
  std::lock_guard<std::mutex> g(g_mu);
  return device < 0 || device >= kMaxDevices || g_used[device] < 0 ? 0 : static_cast<size_t>(g_used[device]);
}

void usage_pages(void* ptr, size_t bytes, bool mapped) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = find_reservation(ptr);
  if (it == g_reservations.end()) return;
  add_locked(it->second.first, mapped ? static_cast<int64_t>(bytes) : -static_cast<int64_t>(bytes));
}

}  // namespace npudist::runtime
