#include "expandable_region.h"

#include <cassert>
#include <new>

namespace npudist::alloc {

ExpandableRegion::ExpandableRegion(DeviceHooks* hooks, size_t va_size, size_t granularity)
    : hooks_(hooks), va_size_((va_size + granularity - 1) / granularity * granularity), gran_(granularity) {
  base_ = static_cast<char*>(hooks_->reserve_address(va_size_));
  if (!base_) throw std::bad_alloc();
  mapped_.assign(va_size_ / gran_, false);
}

ExpandableRegion::~ExpandableRegion() {
  if (base_) hooks_->release_address(base_, va_size_);
}

bool ExpandableRegion::commit(size_t offset, size_t size) {
  assert(offset % gran_ == 0 && size % gran_ == 0 && offset + size <= va_size_);
  if (!hooks_->commit_pages(base_ + offset, size)) return false;
  for (size_t p = offset / gran_; p < (offset + size) / gran_; ++p) {
    assert(!mapped_[p]);
    mapped_[p] = true;
  }
  committed_ += size;
  return true;
}

void ExpandableRegion::decommit(size_t offset, size_t size) {
  assert(offset % gran_ == 0 && size % gran_ == 0 && offset + size <= va_size_);
  hooks_->decommit_pages(base_ + offset, size);
  for (size_t pg = offset / gran_; pg < (offset + size) / gran_; ++pg) {
    assert(mapped_[pg]);
    mapped_[pg] = false;
  }
  committed_ -= size;
}

}  // namespace npudist::alloc
