// Tiny collectives: the op's key and data carried in the step signal's line (see shm_engine_impl.h).
//
// The key is an exact encoding of the fields the mismatch check compares (diagnostics.cpp, differences), so
// equal keys mean descriptors the full check would accept: the check reads the peers' descriptor lines only
// when a key differs, and then reports the mismatch as always. An op whose fields do not fit the key (scale
// other than 1, step or sequence number at or above 2^32, more than kTinyBytes of data) is not tiny and takes
// the descriptor path. A tiny op writes its data both in the line and in its staging slot (a line no peer
// reads while ops stay tiny, so the second write costs no miss), and every rank reads the lines only when
// all keys matched, which every rank sees alike: ranks never disagree on where the data is.
#include <cstring>

#include "shm_engine_impl.h"

namespace npudist::shm::detail {
namespace {

constexpr size_t kKeyBytes = 12;
// Offsets in Signal::carried, by parity: the data 8-byte aligned within the line (a reduction reads it in
// place), then the keys.
constexpr size_t kDataOffset[2] = {4, 12};
constexpr size_t kKeyOffset[2] = {20, 32};
static_assert(kKeyOffset[1] + kKeyBytes <= Signal::kCarriedBytes, "the cells must fit the signal's line");
static_assert(offsetof(Signal, carried) % 8 == 4, "the data offsets assume carried starts 4 bytes past 8");

bool has_reduce(OpKind k) {
  return k == OpKind::kAllReduce || k == OpKind::kReduce;
}

}  // namespace

void ShmEngineImpl::set_tiny_key() {
  std::memset(tiny_key_, 0, sizeof(tiny_key_));
  const OpDesc& d = cur_;
  const bool reduces = has_reduce(d.kind);
  size_t bytes = 0;
  switch (d.kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduce: bytes = d.count * element_bytes(static_cast<ElementType>(d.dtype)); break;
    case OpKind::kBroadcast: bytes = d.count; break;
    case OpKind::kBarrier: break;
    default: tiny_ = false; return;
  }
  tiny_ = tiny_enabled_ && bytes <= kTinyBytes && d.count <= kTinyBytes && (!reduces || d.scale == 1.0) &&
          d.step < (uint64_t{1} << 32) && d.seq < (uint64_t{1} << 32) && d.root >= -1 && d.root < kMaxRanks &&
          d.dtype < 32 && d.redop < 16;
  if (!tiny_) return;
  const bool rooted = d.kind == OpKind::kReduce || d.kind == OpKind::kBroadcast;
  const uint32_t step = static_cast<uint32_t>(d.step), seq = static_cast<uint32_t>(d.seq);
  const uint32_t fields = 1u | static_cast<uint32_t>(d.kind) << 1 | (reduces ? uint32_t{d.dtype} : 0u) << 5 |
                          (reduces ? uint32_t{d.redop} : 0u) << 10 |
                          (rooted ? static_cast<uint32_t>(d.root + 1) : 0u) << 14 |
                          static_cast<uint32_t>(d.count) << 21;
  std::memcpy(tiny_key_, &step, 4);
  std::memcpy(tiny_key_ + 4, &seq, 4);
  std::memcpy(tiny_key_ + 8, &fields, 4);
}

// Written on every op's first step (a key of zeros when the op is not tiny), so a cell never shows an
// earlier op's key as this one's.
void ShmEngineImpl::post_tiny_key() {
  std::memcpy(seg_->ctl(rank_)->step.carried + kKeyOffset[cur_.step & 1], tiny_key_, kKeyBytes);
}

bool ShmEngineImpl::peers_match_tiny_key() const {
  const size_t at = kKeyOffset[step_ & 1];
  for (int j = 0; j < size_; ++j) {
    if (j != rank_ && std::memcmp(seg_->ctl(j)->step.carried + at, tiny_key_, kKeyBytes) != 0) return false;
  }
  return true;
}

unsigned char* ShmEngineImpl::tiny_write() const {
  return seg_->ctl(rank_)->step.carried + kDataOffset[(step_ + 1) & 1];
}

const unsigned char* ShmEngineImpl::tiny_read(int r) const {
  return seg_->ctl(r)->step.carried + kDataOffset[step_ & 1];
}

}  // namespace npudist::shm::detail
