#include "host_memory.h"

#include <sys/mman.h>

#include <cassert>
#include <new>

namespace npudist::alloc {

void* map_fixed_segment(size_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_fixed_segment(void* ptr, size_t size) { munmap(ptr, size); }

ExpandableRegion::ExpandableRegion(size_t va_size, size_t granularity)
    : va_size_((va_size + granularity - 1) / granularity * granularity), gran_(granularity) {
  // PROT_NONE + MAP_NORESERVE: address space only; nothing counts against host memory yet.
  void* p = mmap(nullptr, va_size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  base_ = static_cast<char*>(p);
  mapped_.assign(va_size_ / gran_, false);
}

ExpandableRegion::~ExpandableRegion() {
  if (base_) munmap(base_, va_size_);
}

bool ExpandableRegion::commit(size_t offset, size_t size) {
  assert(offset % gran_ == 0 && size % gran_ == 0 && offset + size <= va_size_);
  if (mprotect(base_ + offset, size, PROT_READ | PROT_WRITE) != 0) return false;
  for (size_t p = offset / gran_; p < (offset + size) / gran_; ++p) {
    assert(!mapped_[p]);
    mapped_[p] = true;
  }
  committed_ += size;
  return true;
}

void ExpandableRegion::decommit(size_t offset, size_t size) {
  assert(offset % gran_ == 0 && size % gran_ == 0 && offset + size <= va_size_);
  // Replacing the range with a fresh PROT_NONE mapping drops the pages (memory goes back to the host)
  // while keeping the address space reserved for a later commit.
  void* p = mmap(base_ + offset, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                 -1, 0);
  assert(p != MAP_FAILED);
  (void)p;
  for (size_t pg = offset / gran_; pg < (offset + size) / gran_; ++pg) {
    assert(mapped_[pg]);
    mapped_[pg] = false;
  }
  committed_ -= size;
}

}  // namespace npudist::alloc
