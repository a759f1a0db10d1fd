// An expandable segment's address range: reserved once, then committed/decommitted page by page through
// the device hooks (aclrtReserveMemAddress + aclrtMapMem on a real device), so a segment grows in place.
#pragma once
#include <cstddef>
#include <vector>

#include "caching_allocator.h"

namespace npudist::alloc {

class ExpandableRegion {
 public:
  // Reserves `va_size` bytes of address space (no memory committed). Throws std::bad_alloc on failure.
  ExpandableRegion(DeviceHooks* hooks, size_t va_size, size_t granularity);
  ~ExpandableRegion();
  ExpandableRegion(const ExpandableRegion&) = delete;
  ExpandableRegion& operator=(const ExpandableRegion&) = delete;

  char* base() const { return base_; }
  size_t va_size() const { return va_size_; }
  size_t granularity() const { return gran_; }
  size_t committed_bytes() const { return committed_; }
  bool page_mapped(size_t page) const { return mapped_[page]; }

  // Commit/decommit the pages covering [offset, offset+size) (granularity-aligned). commit returns
  // false (and commits nothing) if the device refuses; decommit returns the pages' memory to the device.
  bool commit(size_t offset, size_t size);
  void decommit(size_t offset, size_t size);

 private:
  DeviceHooks* hooks_;
  char* base_ = nullptr;
  size_t va_size_;
  size_t gran_;
  size_t committed_ = 0;
  std::vector<bool> mapped_;
};

}  // namespace npudist::alloc
