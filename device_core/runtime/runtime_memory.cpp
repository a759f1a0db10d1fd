// Device memory of the emulated runtime: page-aligned host mappings. Fixed segments are one mmap each
// (aclrtMalloc); growable segments reserve address space once and commit/decommit pages on demand
// (aclrtReserveMemAddress + aclrtMallocPhysical/aclrtMapMem), so a segment grows in place.
// HOST-MEMORY: device memory is host mmap memory; a real device uses aclrtMalloc / aclrtMapMem.
#include "runtime/runtime_internal.h"

#include <sys/mman.h>

#include <pthread.h>
#include <unistd.h>

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

namespace npudist::runtime {

namespace {

struct SharedSegment {
  size_t size;
  int fd;
  uint64_t id;
};

std::mutex g_shared_mu;
std::map<uintptr_t, SharedSegment> g_shared;  // by base address
uint64_t g_next_id = 1;
uint64_t g_released = 0;

bool sharing_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("NPUDIST_SHARED_DEVICE_MEMORY");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

void lock_for_fork() { g_shared_mu.lock(); }
void unlock_after_fork() { g_shared_mu.unlock(); }

// A forked child keeps using the parent's npu memory (tests/allocator: allocator usable in forked child), but
// a shared mapping would let its writes, and its own allocations in cached blocks, land in the parent's
// memory. So the child turns every shared segment into a private copy-on-write view of the same bytes, as
// anonymous memory behaves across fork, and no longer offers them for zero-copy.
void privatize_after_fork() {
  for (auto& [base, seg] : g_shared) {
    mmap(reinterpret_cast<void*>(base), seg.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, seg.fd, 0);
    close(seg.fd);
  }
  g_shared.clear();
  g_shared_mu.unlock();
}

// Registered when the library loads, before the caching allocator registers its own handlers (lazily, on
// first use): prepare handlers run in reverse order, so ours locks only after the allocator's lock_all(),
// when no thread can be inside map_shared/unmap holding an allocator lock.
[[maybe_unused]] const int g_fork_handlers = pthread_atfork(&lock_for_fork, &unlock_after_fork, &privatize_after_fork);

void* map_shared(size_t size) {
  int fd = memfd_create("npudist_npu_segment", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(size)) == 0) {
    p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  std::lock_guard<std::mutex> g(g_shared_mu);
  g_shared[reinterpret_cast<uintptr_t>(p)] = SharedSegment{size, fd, g_next_id++};
  return p;
}

}  // namespace

void* map_fixed_segment(size_t size) {
  if (sharing_enabled()) {
    if (void* p = map_shared(size)) return p;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_fixed_segment(void* ptr, size_t size) {
  munmap(ptr, size);
  std::lock_guard<std::mutex> g(g_shared_mu);
  auto it = g_shared.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_shared.end()) return;
  close(it->second.fd);
  g_shared.erase(it);
  ++g_released;
}

bool lookup_shared_segment(const void* ptr, size_t bytes, NpudistSharedRef* ref) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> g(g_shared_mu);
  auto it = g_shared.upper_bound(p);
  if (it == g_shared.begin()) return false;
  --it;
  const size_t off = p - it->first;
  if (off >= it->second.size || bytes > it->second.size - off) return false;
  *ref = NpudistSharedRef{it->second.fd, it->second.id, it->second.size, off, g_released};
  return true;
}

void* reserve_address(size_t size) {
  // PROT_NONE + MAP_NORESERVE: address space only; nothing counts against host memory yet.
  void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void release_address(void* base, size_t size) { munmap(base, size); }

bool commit_pages(void* ptr, size_t size) { return mprotect(ptr, size, PROT_READ | PROT_WRITE) == 0; }

void decommit_pages(void* ptr, size_t size) {
  // Replacing the range with a fresh PROT_NONE mapping drops the pages (memory goes back to the host)
  // while keeping the address space reserved for a later commit.
  void* p = mmap(ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  assert(p != MAP_FAILED);
  (void)p;
}

}  // namespace npudist::runtime
