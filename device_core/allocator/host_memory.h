// "Device memory" of the emulated NPU: page-aligned host mappings. Fixed segments are one mmap each
// (like aclrtMalloc); expandable segments reserve address space once and commit/decommit 2 MiB pages
// on demand (like aclrtReserveMemAddress + aclrtMapMem), so a segment grows in place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace npudist::alloc {

// Returns nullptr when the host cannot provide the memory.
//
// Fixed segments are shared mappings of a memfd (unless NPUDIST_SHARED_DEVICE_MEMORY=0 or memfd_create
// fails, e.g. out of file descriptors: then private anonymous memory). Peers of the hccl engine on the same
// host map them and read/write tensors in place, which makes large collectives on npu tensors one copy
// per byte instead of two (as CUDA IPC does for NCCL). A forked child gets private copy-on-write views of
// them (host_memory.cpp), so npu memory behaves across fork as anonymous memory does.
void* map_fixed_segment(size_t size);
void unmap_fixed_segment(void* ptr, size_t size);

struct SharedSegmentRef {
  int fd;
  uint64_t id;
  size_t size;
  size_t offset;
  uint64_t epoch;  // shareable segments released so far by this process
};
// True (and *ref filled) if [ptr, ptr + bytes) lies inside one shareable fixed segment.
bool lookup_shared_segment(const void* ptr, size_t bytes, SharedSegmentRef* ref);

class ExpandableRegion {
 public:
  // Reserves `va_size` bytes of address space (no memory committed). Throws std::bad_alloc on failure.
  ExpandableRegion(size_t va_size, size_t granularity);
  ~ExpandableRegion();
  ExpandableRegion(const ExpandableRegion&) = delete;
  ExpandableRegion& operator=(const ExpandableRegion&) = delete;

  char* base() const { return base_; }
  size_t va_size() const { return va_size_; }
  size_t granularity() const { return gran_; }
  size_t committed_bytes() const { return committed_; }
  bool page_mapped(size_t page) const { return mapped_[page]; }

  // Commit/decommit the pages covering [offset, offset+size) (granularity-aligned). commit returns
  // false (and commits nothing) if the host refuses; decommit returns the pages' memory to the host.
  bool commit(size_t offset, size_t size);
  void decommit(size_t offset, size_t size);

 private:
  char* base_ = nullptr;
  size_t va_size_;
  size_t gran_;
  size_t committed_ = 0;
  std::vector<bool> mapped_;
};

}  // namespace npudist::alloc
