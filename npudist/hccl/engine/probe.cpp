// Non-blocking probe of a p2p channel, for receives from any source: the adapter polls each peer's
// next message header (tag, size) and then receives from the first peer whose message matches.
#include "shm_engine_impl.h"

namespace npudist::shm::detail {

bool ShmEngineImpl::peek(int peer, int64_t* tag, uint64_t* bytes) {
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw CommError(FailureKind::kInvalidArgument,
                      "npudist engine: peek peer " + std::to_string(peer) + " is invalid: it must be another rank in [0, " +
                          std::to_string(size_) + ")");
  if (seg_->header()->aborted.load(std::memory_order_acquire)) throw_aborted();
  const ChanCtl* c = seg_->chan(peer, rank_);
  const uint64_t next = c->acked.value.load(std::memory_order_relaxed);  // only this receiver writes it
  if (c->sent.value.load(std::memory_order_acquire) <= next) return false;
  const ChunkMeta m = c->meta[next & 1];
  if (m.chunk != 0) throw CommError(FailureKind::kSystem, "npudist engine: p2p channel out of order");
  *tag = m.tag;
  *bytes = m.msg_bytes;
  return true;
}

}  // namespace npudist::shm::detail
