// Collective algorithms over the step machinery (shm_engine_impl.h). Small reductions are one-shot (every
// rank copies its input into its slot, one sync, every rank reduces all slots); large ones are pipelined
// reduce-scatter + all-gather in cache-sized chunks so every rank's core reduces its own segment.
#include <algorithm>
#include <cstring>

#include "shm_engine_impl.h"
#include "memops.h"
#include "reduce.h"

namespace npudist::shm::detail {
namespace {

// The messages are built only on failure: these checks run on every collective.
[[noreturn]] void invalid(const std::string& msg) {
  throw CommError(FailureKind::kInvalidArgument, "npudist engine: " + msg);
}

void require(bool ok, const char* msg) {
  if (!ok) invalid(msg);
}

void check_root(int root, int n) {
  if (root < 0 || root >= n) {
    invalid("root " + std::to_string(root) + " is outside the communicator's ranks [0, " + std::to_string(n) + ")");
  }
}

// Elements per rank segment such that `n` segments fit in `bytes`, a multiple of one cache line.
size_t segment_elems(size_t bytes, int n, size_t es) {
  size_t per = bytes / n / 64 * 64;
  return std::max<size_t>(per / es, 1);
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

inline const char* cptr(const void* p, size_t off) { return static_cast<const char*>(p) + off; }
inline char* mptr(void* p, size_t off) { return static_cast<char*>(p) + off; }

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return na && nb && x < y + nb && y < x + na;
}

}  // namespace

void ShmEngineImpl::all_reduce(const void* in, void* out, size_t count, ElementType t, Reduction op,
                                 const CollectiveInfo& info, double scale) {
  check_reduce_supported(t, op, scale);
  if (count != 0 && !(in && out)) invalid("all_reduce got a null buffer for " + std::to_string(count) + " elements");
  OpDesc d = make_desc(OpKind::kAllReduce, info, count, -1);
  d.dtype = static_cast<uint8_t>(t);
  d.redop = static_cast<uint8_t>(op);
  d.scale = scale;
  const size_t bytes = count * element_bytes(t);
  // In place or disjoint: each slice is read and written by one rank only.
  if (zc_candidate(bytes) && (in == out || !overlaps(in, bytes, out, bytes))) publish_shared(d, in, bytes, out, bytes);
  begin(d);
  if (bytes <= one_shot_bytes_) return reduce_one_shot(in, out, count, t, op, -1, scale);
  if (zc_candidate(bytes)) {
    sync();
    if (all_shared()) return all_reduce_zc(in, out, count, t, op, scale);
  }
  reduce_pipelined(in, out, count, t, op, -1, scale);
}

void ShmEngineImpl::reduce(const void* in, void* out, size_t count, ElementType t, Reduction op, int root,
                             const CollectiveInfo& info, double scale) {
  check_reduce_supported(t, op, scale);
  check_root(root, size_);
  require(count == 0 || (in && (out || rank_ != root)), "reduce got a null buffer");
  OpDesc d = make_desc(OpKind::kReduce, info, count, root);
  d.dtype = static_cast<uint8_t>(t);
  d.redop = static_cast<uint8_t>(op);
  d.scale = scale;
  begin(d);
  if (count * element_bytes(t) <= one_shot_bytes_) return reduce_one_shot(in, out, count, t, op, root, scale);
  reduce_pipelined(in, out, count, t, op, root, scale);
}

// root < 0: every rank receives the result (all_reduce).
void ShmEngineImpl::reduce_one_shot(const void* in, void* out, size_t count, ElementType t, Reduction op,
                                      int root, double scale) {
  const size_t bytes = count * element_bytes(t);
  if (bytes) {
    std::memcpy(write_half(), in, bytes);
    if (tiny()) std::memcpy(tiny_write(), in, bytes);  // and in the line of the post (tiny.cpp)
  }
  sync();
  if (root >= 0 && root != rank_) return;
  for (int j = 0; j < size_; ++j) {
    srcs_[j] = j == rank_ ? in : tiny() ? static_cast<const void*>(tiny_read(j)) : read_half(j);
  }
  if (count) reduce_buffers(t, op, srcs_.data(), size_, out, nullptr, count, scale);
}

void ShmEngineImpl::reduce_pipelined(const void* in, void* out, size_t count, ElementType t, Reduction op,
                                       int root, double scale) {
  const size_t es = element_bytes(t);
  const size_t seg_max = segment_elems(reduce_pipe_bytes_, size_, es);
  const size_t align = std::max<size_t>(64 / es, 1);
  const size_t chunk_max = seg_max * size_;
  const bool gather_here = root < 0 || root == rank_;
  // In place (as torch.distributed calls all_reduce) the output lines were just read and are cached:
  // streaming stores would evict them and measured 1.4-1.7x slower there (engine_bench, 16-128 MiB).
  const bool stream = count * es >= stream_bytes_ && in != out;
  for (size_t off = 0; off < count; off += chunk_max) {
    const size_t c = std::min(chunk_max, count - off);
    const size_t seg = std::min(seg_max, align_up((c + size_ - 1) / size_, align));
    auto seg_len = [&](int j) {
      size_t b = std::min(c, j * seg);
      return std::min(c, b + seg) - b;
    };
    // Step A: publish the segments the other ranks reduce.
    char* w = write_half();
    for (int j = 0; j < size_; ++j) {
      if (j != rank_ && seg_len(j)) std::memcpy(w + j * seg * es, cptr(in, (off + j * seg) * es), seg_len(j) * es);
    }
    sync();
    // Reduce my segment from my own input and the peers' slots; publish it for the all-gather.
    const size_t my = seg_len(rank_);
    for (int j = 0; j < size_; ++j) {
      srcs_[j] = j == rank_ ? cptr(in, (off + rank_ * seg) * es) : read_half(j) + rank_ * seg * es;
    }
    char* w2 = write_half() + rank_ * seg * es;
    if (my) {
      void* dst = gather_here ? mptr(out, (off + rank_ * seg) * es) : w2;
      reduce_buffers(t, op, srcs_.data(), size_, dst, gather_here ? w2 : nullptr, my, scale, stream && gather_here);
    }
    sync();
    // Step B: collect the other ranks' reduced segments.
    if (!gather_here) continue;
    for (int j = 0; j < size_; ++j) {
      if (j != rank_ && seg_len(j)) copy_out(mptr(out, (off + j * seg) * es), read_half(j) + j * seg * es, seg_len(j) * es, stream);
    }
  }
  if (stream) stream_fence();
  if (count == 0) sync();  // zero-size ops still meet (arrival and mismatch check)
}

void ShmEngineImpl::broadcast(void* buf, size_t bytes, int root, const CollectiveInfo& info) {
  check_root(root, size_);
  require(bytes == 0 || buf, "broadcast got a null buffer");
  OpDesc d = make_desc(OpKind::kBroadcast, info, bytes, root);
  d.src_addr = reinterpret_cast<uint64_t>(buf);
  if (zc_candidate(bytes)) publish_shared(d, buf, bytes, nullptr, 0);  // read (root) or written (others) by peers
  begin(d);
  if (zc_candidate(bytes)) {
    sync();
    if (all_shared()) return broadcast_zc(buf, bytes, root);
  }
  // Broadcast's direct path moves each byte once in all (every rank moves one slice), its staged path twice
  // (the root into the slot, each receiver out of it): direct stays ahead 4x further (docs/hccl_engine.md).
  if (use_direct(bytes, 4)) return broadcast_direct(buf, bytes, root);
  if (bytes <= kTinyBytes) {
    if (rank_ == root && bytes) {
      std::memcpy(write_half(), buf, bytes);
      if (tiny()) std::memcpy(tiny_write(), buf, bytes);  // and in the line of the post (tiny.cpp)
    }
    sync();
    if (rank_ != root && bytes) std::memcpy(buf, tiny() ? static_cast<const void*>(tiny_read(root)) : read_half(root), bytes);
    return;
  }
  size_t off = 0;
  do {
    const size_t len = std::min(pipe_bytes_, bytes - off);
    if (rank_ == root && len) std::memcpy(write_half(), cptr(buf, off), len);
    sync();
    if (rank_ != root && len) copy_out(mptr(buf, off), read_half(root), len, bytes >= stream_bytes_);
    off += len;
  } while (off < bytes);
  if (bytes >= stream_bytes_) stream_fence();
}

void ShmEngineImpl::all_gather(const void* in, void* out, size_t bytes, const CollectiveInfo& info) {
  require(bytes == 0 || (in && out), "all_gather got a null buffer");
  OpDesc d = make_desc(OpKind::kAllGather, info, bytes, -1);
  d.src_addr = reinterpret_cast<uint64_t>(in);
  // Peers read `in` while this rank writes the other ranks' blocks of `out`: `in` may only be its own block.
  const bool in_ok = in == mptr(out, rank_ * bytes) || !overlaps(in, bytes, out, bytes * size_);
  if (zc_candidate(bytes * size_) && in_ok) publish_shared(d, in, bytes, nullptr, 0);
  begin(d);
  if (zc_candidate(bytes * size_)) {
    sync();
    if (all_shared()) return all_gather_zc(in, out, bytes);
  }
  if (use_direct(bytes * size_)) return all_gather_direct(in, out, bytes);
  size_t off = 0;
  do {
    const size_t len = std::min(pipe_bytes_, bytes - off);
    if (len) std::memcpy(write_half(), cptr(in, off), len);
    sync();
    for (int j = 0; j < size_ && len; ++j) {
      if (j != rank_) copy_out(mptr(out, j * bytes + off), read_half(j), len, bytes * size_ >= stream_bytes_);
    }
    off += len;
  } while (off < bytes);
  if (bytes * size_ >= stream_bytes_) stream_fence();
  if (bytes && cptr(in, 0) != mptr(out, rank_ * bytes)) std::memmove(mptr(out, rank_ * bytes), in, bytes);
}

void ShmEngineImpl::reduce_scatter(const void* in, void* out, size_t count, ElementType t, Reduction op,
                                     const CollectiveInfo& info, double scale) {
  check_reduce_supported(t, op, scale);
  require(count == 0 || (in && out), "reduce_scatter got a null buffer");
  OpDesc d = make_desc(OpKind::kReduceScatter, info, count, -1);
  d.dtype = static_cast<uint8_t>(t);
  d.redop = static_cast<uint8_t>(op);
  d.scale = scale;
  const size_t es = element_bytes(t);
  // Peers read the other blocks of `in` while this rank writes `out`: `out` may only alias its own block.
  const bool out_ok = out == cptr(in, rank_ * count * es) || !overlaps(in, count * es * size_, out, count * es);
  if (zc_candidate(count * es * size_) && out_ok) publish_shared(d, in, count * es * size_, nullptr, 0);
  begin(d);
  if (zc_candidate(count * es * size_)) {
    sync();
    if (all_shared()) return reduce_scatter_zc(in, out, count, t, op, scale);
  }
  const size_t piece = segment_elems(reduce_pipe_bytes_, size_, es);
  size_t off = 0;
  do {
    const size_t len = std::min(piece, count - off);
    char* w = write_half();
    for (int j = 0; j < size_ && len; ++j) {
      if (j != rank_) std::memcpy(w + j * piece * es, cptr(in, (j * count + off) * es), len * es);
    }
    sync();
    for (int j = 0; j < size_; ++j) {
      srcs_[j] = j == rank_ ? cptr(in, (rank_ * count + off) * es) : read_half(j) + rank_ * piece * es;
    }
    if (len) reduce_buffers(t, op, srcs_.data(), size_, mptr(out, off * es), nullptr, len, scale);
    off += len;
  } while (off < count);
}

// The largest split any rank sends or receives in the current all_to_all (after its first sync).
size_t ShmEngineImpl::largest_split() const {
  size_t mx = 0;
  for (int j = 0; j < size_; ++j) mx = std::max<size_t>(mx, peer_desc(j).extra);
  return mx;
}

void ShmEngineImpl::all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets,
                                 void* out, const size_t* recv_counts, const size_t* recv_offsets,
                                 const CollectiveInfo& info) {
  require(send_counts && send_offsets && recv_counts && recv_offsets, "all_to_all got null count/offset arrays");
  size_t mx = 0;
  for (int j = 0; j < size_; ++j) {
    mx = std::max({mx, send_counts[j], recv_counts[j]});
    require(send_counts[j] == 0 || in, "all_to_all got a null input buffer");
    require(recv_counts[j] == 0 || out, "all_to_all got a null output buffer");
  }
  OpDesc d = make_desc(OpKind::kAllToAll, info, 0, -1);
  d.extra = mx;
  d.src_addr = reinterpret_cast<uint64_t>(in);
  size_t in_extent = 0, out_extent = 0;
  for (int j = 0; j < size_; ++j) {
    if (send_counts[j]) in_extent = std::max(in_extent, send_offsets[j] + send_counts[j]);
    if (recv_counts[j]) out_extent = std::max(out_extent, recv_offsets[j] + recv_counts[j]);
  }
  // Peers read `in` while this rank writes `out`, so they must not overlap.
  if (zc_ok_ && !overlaps(in, in_extent, out, out_extent)) publish_shared(d, in, in_extent, nullptr, 0);
  begin(d, send_counts, recv_counts, send_offsets);
  if (zc_ok_ || direct_ok_) {
    // Split sizes differ per rank, so whether to go zero-copy or direct is only known after every rank's
    // descriptor is visible: one extra sync on communicators that can take either path. Deciding here, and
    // not after the staged path's first step, spares a direct op that step's copy into the slot (up to a
    // pipeline piece per peer; docs/hccl_engine.md).
    sync();
    const size_t largest = largest_split() * size_;
    if (zc_ok_ && all_shared() && largest >= zc_bytes_)
      return all_to_all_zc(in, send_counts, send_offsets, out, recv_counts, recv_offsets);
    if (use_direct(largest)) return all_to_all_direct(in, send_counts, send_offsets, out, recv_counts, recv_offsets);
  }
  // One pipeline chunk per destination (as all_gather moves per source), within the slot half.
  const size_t piece = std::max<size_t>(std::min(half_, pipe_bytes_ * size_) / size_ / 64 * 64, 64);
  size_t steps = 0;  // known after the first sync, from every rank's largest split
  size_t recv_total = 0;
  for (int j = 0; j < size_; ++j) recv_total += recv_counts[j];
  const bool stream = recv_total >= stream_bytes_;
  for (size_t k = 0; k == 0 || k < steps; ++k) {
    char* w = write_half();
    const size_t base = k * piece;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_ || send_counts[j] <= base) continue;
      std::memcpy(w + j * piece, cptr(in, send_offsets[j] + base), std::min(piece, send_counts[j] - base));
    }
    sync();
    if (k == 0) {
      const size_t global_max = largest_split();
      steps = std::max<size_t>(1, (global_max + piece - 1) / piece);
    }
    for (int j = 0; j < size_; ++j) {
      if (j == rank_ || recv_counts[j] <= base) continue;
      copy_out(mptr(out, recv_offsets[j] + base), read_half(j) + rank_ * piece, std::min(piece, recv_counts[j] - base),
               stream);
    }
  }
  if (send_counts[rank_] && cptr(in, send_offsets[rank_]) != mptr(out, recv_offsets[rank_]))
    move_own(mptr(out, recv_offsets[rank_]), cptr(in, send_offsets[rank_]), send_counts[rank_], stream);
  if (stream) stream_fence();
}

void ShmEngineImpl::gather(const void* in, void* out, size_t bytes, int root, const CollectiveInfo& info) {
  check_root(root, size_);
  require(bytes == 0 || (in && (out || rank_ != root)), "gather got a null buffer");
  OpDesc d = make_desc(OpKind::kGather, info, bytes, root);
  d.src_addr = reinterpret_cast<uint64_t>(in);
  begin(d);
  if (use_direct(bytes * size_)) return gather_direct(in, out, bytes, root);
  size_t off = 0;
  do {
    const size_t len = std::min(pipe_bytes_, bytes - off);
    if (rank_ != root && len) std::memcpy(write_half(), cptr(in, off), len);
    sync();
    for (int j = 0; j < size_ && rank_ == root && len; ++j) {
      if (j != rank_) std::memcpy(mptr(out, j * bytes + off), read_half(j), len);
    }
    off += len;
  } while (off < bytes);
  if (rank_ == root && bytes && cptr(in, 0) != mptr(out, rank_ * bytes))
    std::memmove(mptr(out, rank_ * bytes), in, bytes);
}

void ShmEngineImpl::scatter(const void* in, void* out, size_t bytes, int root, const CollectiveInfo& info) {
  check_root(root, size_);
  require(bytes == 0 || (out && (in || rank_ != root)), "scatter got a null buffer");
  OpDesc d = make_desc(OpKind::kScatter, info, bytes, root);
  d.src_addr = reinterpret_cast<uint64_t>(in);
  begin(d);
  if (use_direct(bytes * size_)) return scatter_direct(in, out, bytes, root);
  // One pipeline chunk per destination (as all_gather moves per source), within the slot half.
  const size_t piece = std::max<size_t>(std::min(half_, pipe_bytes_ * size_) / size_ / 64 * 64, 64);
  size_t off = 0;
  do {
    const size_t len = std::min(piece, bytes - off);
    char* w = write_half();
    for (int j = 0; j < size_ && rank_ == root && len; ++j) {
      if (j != rank_) std::memcpy(w + j * piece, cptr(in, j * bytes + off), len);
    }
    sync();
    if (rank_ != root && len) std::memcpy(mptr(out, off), read_half(root) + rank_ * piece, len);
    off += len;
  } while (off < bytes);
  if (rank_ == root && bytes && cptr(in, root * bytes) != mptr(out, 0))
    std::memmove(out, cptr(in, root * bytes), bytes);
}

void ShmEngineImpl::barrier(const CollectiveInfo& info) {
  begin(make_desc(OpKind::kBarrier, info, 0, -1));
  sync();
}

}  // namespace npudist::shm::detail
