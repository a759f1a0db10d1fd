// Point-to-point over per-direction channels: a two-chunk ring per (src, dst) pair. A send returns once its
// last chunk is in the ring, so messages up to one chunk complete without the receiver (both sides may
// send first). Each chunk carries (tag, message size, index): a receive that does not match the next
// message from that peer fails with kMismatch and leaves the message for a matching receive.
// Zero-copy: a message larger than the whole ring (so its send waits for the receiver anyway) whose buffer
// lives in shareable memory (npu tensors) is not copied through the ring: the sender posts where it lives
// in place of a chunk, the receiver maps it and copies it once into its own buffer, and the sender returns
// when the receiver acknowledges.
#include <algorithm>
#include <cstring>

#include "shm_engine_impl.h"
#include "memops.h"

namespace npudist::shm::detail {
namespace {

void check_peer(int peer, int rank, int n, const char* what) {
  if (peer < 0 || peer >= n || peer == rank)
    throw CommError(FailureKind::kInvalidArgument,
                      std::string("npudist engine: ") + what + " peer " + std::to_string(peer) +
                          " is invalid: it must be another rank in [0, " + std::to_string(n) + ")");
}

}  // namespace

WaitContext ShmEngineImpl::p2p_context(int peer, const std::string& what) const {
  WaitContext ctx;
  ctx.deadline = Clock::now() + cfg_.timeout;
  ctx.spin_ns = ctx_.spin_ns;
  ctx.abort_flag = &seg_->header()->aborted;
  ctx.peer_alive = [this](int p) { return process_alive(seg_->ctl(p)->proc); };
  ctx.on_fail = [this, what](int why, int p) {
    if (why == kWhyAborted) const_cast<ShmEngineImpl*>(this)->throw_aborted();
    const int g = global_rank(p);
    if (why == kWhyPeerDied)
      throw CommError(FailureKind::kPeerDied,
                        "npudist engine: rank " + std::to_string(g) + " exited during " + what +
                            " on communicator '" + cfg_.name + "'",
                        {g});
    throw CommError(FailureKind::kTimeout,
                      "npudist engine: " + what + " on communicator '" + cfg_.name + "' timed out after " +
                          std::to_string(cfg_.timeout.count()) + " ms: rank " + std::to_string(g) +
                          " did not post the matching operation",
                      {g});
  };
  (void)peer;
  return ctx;
}

void ShmEngineImpl::send(const void* buf, size_t bytes, int peer, int tag) {
  check_peer(peer, rank_, size_, "send");
  if (bytes && !buf) throw CommError(FailureKind::kInvalidArgument, "npudist engine: send got a null buffer");
  if (seg_->header()->aborted.load(std::memory_order_acquire)) throw_aborted();
  ChanCtl* c = seg_->chan(rank_, peer);
  char* data = seg_->p2p(rank_, peer);
  const size_t half = seg_->p2p_bytes() / 2;
  const size_t nchunks = std::max<size_t>(1, (bytes + half - 1) / half);
  const std::string what = "send of " + std::to_string(bytes) + " bytes (tag " + std::to_string(tag) +
                           ") to rank " + std::to_string(global_rank(peer));
  WaitContext ctx = p2p_context(peer, what);
  if (nchunks > 2 && send_zero_copy(buf, bytes, peer, tag, ctx)) return;
  uint64_t idx = c->sent.value.load(std::memory_order_relaxed);  // only this sender writes it
  for (size_t k = 0; k < nchunks; ++k, ++idx) {
    // Half idx%2 was last used by chunk idx-2; the receiver acknowledged it by posting acked >= idx-1.
    if (idx >= 2) wait_at_least(c->acked, idx - 1, peer, ctx);
    const size_t off = k * half;
    const size_t len = std::min(half, bytes - std::min(bytes, off));
    if (len) std::memcpy(data + (idx & 1) * half, static_cast<const char*>(buf) + off, len);
    c->meta[idx & 1] = ChunkMeta{tag, bytes, k, len, 0, SharedBuffer{}};
    c->sent.post(idx + 1);
  }
}

// Only when every rank can map its peers' memory (agreed at connect) and `buf` is shareable.
bool ShmEngineImpl::send_zero_copy(const void* buf, size_t bytes, int peer, int tag, const WaitContext& ctx) {
  SharedBuffer where;
  if (!zc_ok_ || !cfg_.shared_resolver || !cfg_.shared_resolver(buf, bytes, &where)) return false;
  ChanCtl* c = seg_->chan(rank_, peer);
  const uint64_t idx = c->sent.value.load(std::memory_order_relaxed);
  if (idx >= 2) wait_at_least(c->acked, idx - 1, peer, ctx);
  c->meta[idx & 1] = ChunkMeta{tag, bytes, 0, 0, 1, where};
  c->sent.post(idx + 1);
  wait_at_least(c->acked, idx + 1, peer, ctx);  // the receiver has copied it: `buf` may change again
  return true;
}

void ShmEngineImpl::recv(void* buf, size_t bytes, int peer, int tag) {
  check_peer(peer, rank_, size_, "recv");
  if (bytes && !buf) throw CommError(FailureKind::kInvalidArgument, "npudist engine: recv got a null buffer");
  if (seg_->header()->aborted.load(std::memory_order_acquire)) throw_aborted();
  ChanCtl* c = seg_->chan(peer, rank_);
  const char* data = seg_->p2p(peer, rank_);
  const size_t half = seg_->p2p_bytes() / 2;
  const size_t nchunks = std::max<size_t>(1, (bytes + half - 1) / half);
  const std::string what = "recv of " + std::to_string(bytes) + " bytes (tag " + std::to_string(tag) +
                           ") from rank " + std::to_string(global_rank(peer));
  WaitContext ctx = p2p_context(peer, what);
  uint64_t idx = c->acked.value.load(std::memory_order_relaxed);  // only this receiver writes it
  for (size_t k = 0; k < nchunks; ++k, ++idx) {
    wait_at_least(c->sent, idx + 1, peer, ctx);
    const ChunkMeta m = c->meta[idx & 1];
    if (m.chunk != k || m.tag != tag || m.msg_bytes != bytes) {
      if (k != 0 || m.chunk != 0)
        throw CommError(FailureKind::kSystem, "npudist engine: p2p channel out of order");
      throw CommError(FailureKind::kMismatch,
                        "npudist engine: " + what + " does not match the next message from that rank: it sent " +
                            std::to_string(m.msg_bytes) + " bytes with tag " + std::to_string(m.tag) +
                            " (messages between two ranks are matched in order; sizes and tags must agree)",
                        {global_rank(peer)});
    }
    if (m.zero_copy) {
      const bool stream = bytes >= stream_bytes_;
      copy_out(buf, map_shared_p2p(peer, m.shared), bytes, stream);
      if (stream) stream_fence();
      ++zc_ops_;
      c->acked.post(idx + 1);
      return;
    }
    if (m.chunk_bytes) std::memcpy(static_cast<char*>(buf) + k * half, data + (idx & 1) * half, m.chunk_bytes);
    c->acked.post(idx + 1);
  }
}

}  // namespace npudist::shm::detail
