// Zero-copy collectives: when every rank's buffers live in shareable memory (memfd segments of the npu
// allocator), each rank maps its peers' segments once (/proc/<pid>/fd/<fd>, cached per segment) and the
// data moves once: a reading rank copies straight from the peer's buffer into its own, and all_reduce's
// reducer of a slice reads that slice from every rank and writes the result into every rank's output.
// Why: with private buffers each byte is copied into the staging slot and out again, and the second read
// (from another core's cache) costs as much as the first; reads bound a core's bandwidth here, so halving
// them is the only way to approach the memory system's limit (docs/hccl_engine.md).
//
// Every zero-copy op is: a sync (all ranks entered; descriptors with the buffer locations visible), the
// copy/reduce, a sync (every peer is done with this rank's buffers before anyone returns).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "shm_engine_impl.h"
#include "diagnostics.h"
#include "memops.h"
#include "reduce.h"

namespace npudist::shm::detail {
namespace {

inline const char* cptr(const void* p, size_t off) { return static_cast<const char*>(p) + off; }
inline char* mptr(void* p, size_t off) { return static_cast<char*>(p) + off; }

// Bytes reduced per block: fits L1 with room for the sources' lines.
constexpr size_t kReduceBlockBytes = 16 * 1024;

}  // namespace

void ShmEngineImpl::publish_shared(OpDesc& d, const void* src, size_t src_bytes, const void* dst,
                                     size_t dst_bytes) const {
  d.zc_ok = 0;
  if (!zc_ok_) return;
  bool ok = true;
  if (src && src_bytes) ok = cfg_.shared_resolver(src, src_bytes, &d.zc_src);
  if (ok && dst && dst_bytes) ok = cfg_.shared_resolver(dst, dst_bytes, &d.zc_dst);
  d.zc_ok = ok ? 1 : 0;
}

bool ShmEngineImpl::all_shared() const {
  for (int j = 0; j < size_; ++j) {
    if (!peer_desc(j).zc_ok) return false;
  }
  return true;
}

namespace {

// Maps `b` of process `pid` through the cache `m` (segment id -> mapping); nullptr and errno on failure.
char* map_cached(std::vector<std::pair<uint64_t, std::pair<char*, size_t>>>& segs, uint64_t& epoch, pid_t pid,
                 const SharedBuffer& b, std::string* path) {
  if (epoch != b.epoch) {
    // The peer released segments since we last looked: drop every mapping so none keeps freed memory alive.
    for (auto& s : segs) munmap(s.second.first, s.second.second);
    segs.clear();
    epoch = b.epoch;
  }
  for (auto& s : segs) {
    if (s.first == b.segment_id) return s.second.first + b.offset;
  }
  *path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(b.fd);
  void* p = MAP_FAILED;
  int fd = open(path->c_str(), O_RDWR | O_CLOEXEC);
  int err = errno;
  if (fd >= 0) {
    p = mmap(nullptr, b.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    err = errno;
    close(fd);
  }
  if (p == MAP_FAILED) {
    errno = err;
    return nullptr;
  }
  madvise(p, b.segment_size, MADV_DONTFORK);
  segs.push_back({b.segment_id, {static_cast<char*>(p), static_cast<size_t>(b.segment_size)}});
  return static_cast<char*>(p) + b.offset;
}

}  // namespace

char* ShmEngineImpl::map_shared(int peer, const SharedBuffer& b) {
  PeerMappings& m = peer_maps_[peer];
  std::string path;
  if (char* p = map_cached(m.segs, m.epoch, seg_->ctl(peer)->proc.pid, b, &path)) return p;
  // Peers already decided on zero-copy for this op: fail all of them now rather than let them time out.
  std::string msg = "npudist engine: mapping rank " + std::to_string(global_rank(peer)) + "'s device memory (" +
                    path + ", " + std::to_string(b.segment_size) + " bytes) failed in " + op_kind_name(cur_.kind) +
                    ": " + std::strerror(errno) + " (set NPUDIST_ENGINE_ZERO_COPY=0 on all ranks to use staging copies)";
  abort(msg);
  broken_ = CommError(FailureKind::kSystem, msg, {global_rank(peer)});
  throw *broken_;
}

const char* ShmEngineImpl::map_shared_p2p(int peer, const SharedBuffer& b) {
  PeerMappings& m = p2p_maps_[peer];
  std::string path;
  if (char* p = map_cached(m.segs, m.epoch, seg_->ctl(peer)->proc.pid, b, &path)) return p;
  // The sender waits for this receive's acknowledgement: abort so it fails now instead of timing out.
  std::string msg = "npudist engine: mapping rank " + std::to_string(global_rank(peer)) + "'s device memory (" +
                    path + ", " + std::to_string(b.segment_size) + " bytes) for a recv failed: " +
                    std::strerror(errno) + " (set NPUDIST_ENGINE_ZERO_COPY=0 on all ranks to copy through the ring)";
  abort(msg);
  throw CommError(FailureKind::kSystem, msg, {global_rank(peer)});
}

void ShmEngineImpl::unmap_all_shared() {
  for (auto* maps : {&peer_maps_, &p2p_maps_}) {
    for (auto& m : *maps) {
      for (auto& s : m.segs) munmap(s.second.first, s.second.second);
      m.segs.clear();
    }
  }
}

void ShmEngineImpl::all_reduce_zc(const void* in, void* out, size_t count, ElementType t, Reduction op,
                                    double scale) {
  const size_t es = element_bytes(t);
  for (int j = 0; j < size_; ++j) {
    zc_src_[j] = j == rank_ ? static_cast<const char*>(in) : map_shared(j, peer_desc(j).zc_src);
    zc_dst_[j] = j == rank_ ? static_cast<char*>(out) : map_shared(j, peer_desc(j).zc_dst);
  }
  // This rank's slice, cache-line aligned; nobody else reads or writes it, so in-place calls are safe
  // (each block is read from every source before it is written to any output).
  const size_t align = std::max<size_t>(64 / es, 1);
  const size_t per = (count + size_ - 1) / size_;
  const size_t slice = (per + align - 1) / align * align;
  const size_t lo = std::min(count, static_cast<size_t>(rank_) * slice);
  const size_t hi = std::min(count, lo + slice);
  const size_t block = std::max<size_t>(kReduceBlockBytes / es, 1);
  if (zc_tmp_.size() < block * es) zc_tmp_.resize(block * es);
  // Streaming stores only into outputs that are not the input: in place, the block was just read and sits
  // in cache, where plain stores are 1.4-1.9x faster (engine_bench, in-place vs streaming).
  const bool stream = count * es >= stream_bytes_;
  for (size_t b = lo; b < hi; b += block) {
    const size_t m = std::min(block, hi - b);
    for (int j = 0; j < size_; ++j) srcs_[j] = zc_src_[j] + b * es;
    reduce_buffers(t, op, srcs_.data(), size_, zc_tmp_.data(), nullptr, m, scale);
    for (int k = 0; k < size_; ++k) {
      const int j = (rank_ + k) % size_;
      copy_out(zc_dst_[j] + b * es, zc_tmp_.data(), m * es, stream && zc_dst_[j] != zc_src_[j]);
    }
  }
  stream_fence();
  sync();
  ++zc_ops_;
}

void ShmEngineImpl::reduce_scatter_zc(const void* in, void* out, size_t count, ElementType t, Reduction op,
                                        double scale) {
  const size_t es = element_bytes(t);
  for (int j = 0; j < size_; ++j) {
    const char* base = j == rank_ ? static_cast<const char*>(in) : map_shared(j, peer_desc(j).zc_src);
    srcs_[j] = base + rank_ * count * es;
  }
  if (count) reduce_buffers(t, op, srcs_.data(), size_, out, nullptr, count, scale, count * es >= stream_bytes_);
  stream_fence();
  sync();
  ++zc_ops_;
}

void ShmEngineImpl::all_gather_zc(const void* in, void* out, size_t bytes) {
  const bool stream = bytes * size_ >= stream_bytes_;
  for (int k = 1; k < size_; ++k) {
    const int j = (rank_ + k) % size_;
    copy_out(mptr(out, j * bytes), map_shared(j, peer_desc(j).zc_src), bytes, stream);
  }
  if (cptr(in, 0) != mptr(out, rank_ * bytes)) move_own(mptr(out, rank_ * bytes), in, bytes, stream);
  stream_fence();
  sync();
  ++zc_ops_;
}

// Every rank (root included) copies a 1/n slice of the root's buffer into every non-root rank's buffer, so
// all cores copy at once instead of only the receivers.
void ShmEngineImpl::broadcast_zc(void* buf, size_t bytes, int root) {
  const char* src = rank_ == root ? static_cast<const char*>(buf) : map_shared(root, peer_desc(root).zc_src);
  for (int j = 0; j < size_; ++j) {
    if (j != root) zc_dst_[j] = j == rank_ ? static_cast<char*>(buf) : map_shared(j, peer_desc(j).zc_src);
  }
  const size_t per = ((bytes + size_ - 1) / size_ + 63) / 64 * 64;
  const size_t lo = std::min(bytes, static_cast<size_t>(rank_) * per);
  const size_t hi = std::min(bytes, lo + per);
  for (int k = 0; k < size_ && hi > lo; ++k) {
    const int j = (rank_ + k) % size_;
    if (j != root) copy_out(zc_dst_[j] + lo, src + lo, hi - lo, bytes >= stream_bytes_);
  }
  stream_fence();
  sync();
  ++zc_ops_;
}

// Called after a sync that made every rank's descriptor, counts and offsets visible.
void ShmEngineImpl::all_to_all_zc(const void* in, const size_t* send_counts, const size_t* send_offsets,
                                    void* out, const size_t* recv_counts, const size_t* recv_offsets) {
  size_t recv_total = 0;
  for (int j = 0; j < size_; ++j) recv_total += recv_counts[j];
  const bool stream = recv_total >= stream_bytes_;
  for (int k = 1; k < size_; ++k) {
    const int j = (rank_ + k) % size_;
    if (recv_counts[j] == 0) continue;
    const char* src = map_shared(j, peer_desc(j).zc_src) + a2a_offset_from(j);
    copy_out(mptr(out, recv_offsets[j]), src, recv_counts[j], stream);
  }
  const char* src = cptr(in, send_offsets[rank_]);
  char* dst = mptr(out, recv_offsets[rank_]);
  if (send_counts[rank_] && src != dst) move_own(dst, src, send_counts[rank_], stream);
  stream_fence();
  sync();
  ++zc_ops_;
}

}  // namespace npudist::shm::detail
