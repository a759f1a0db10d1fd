// The shared-memory segment of one communicator: layout, creation/attachment and unlinking.
// The segment is unlinked as soon as every rank has mapped it, so no exit (even SIGKILL) leaves a
// /dev/shm entry behind; only a crash inside the short connect window can, and that is cleaned by the
// ranks still alive (rank 0 unlinks when the attach deadline passes). Internal.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine.h"
#include "sync.h"

namespace npudist::shm::detail {

constexpr int kMaxRanks = 64;

enum class OpKind : uint8_t {
  kNone, kAllReduce, kReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kGather, kScatter, kBarrier
};

// What a rank is doing in the collective that starts at `step`; compared across ranks.
struct OpDesc {
  uint64_t step;
  uint64_t seq;
  uint64_t count;  // elements for reductions, bytes otherwise
  uint64_t extra;  // all_to_all: the largest byte count this rank sends or receives
  double scale;
  int32_t root;
  OpKind kind;
  uint8_t dtype;
  uint8_t redop;
  uint8_t has_dtype;
  char name[40];   // the caller's op name (CollectiveInfo::op), for messages
  uint64_t src_addr;  // this rank's input/output buffer addresses (direct mode reads them with CMA)
  uint64_t dst_addr;
  // Zero-copy (zero_copy.cpp): where the input/output live in shareable memory, if they do.
  SharedBuffer zc_src;
  SharedBuffer zc_dst;
  uint8_t zc_ok;      // 1: both buffers (those this op uses) are shareable
};

struct alignas(64) RankCtl {
  Signal step;                 // last step this rank posted
  ProcessId proc;              // who attached as this rank (for liveness checks)
  std::atomic<uint32_t> attached;
  OpDesc desc[2];              // by parity of the op's first step
  // all_to_all by parity: [0] send counts, [1] recv counts, [2] send offsets, per peer (bytes)
  uint64_t a2a[2][3][kMaxRanks];
  uint64_t probe_token;           // connect-time check that peers can read this process's memory
  std::atomic<uint32_t> probe_ok;
  int32_t probe_fd;               // connect-time check that peers can map this process's memfds
};

struct ChunkMeta {
  int64_t tag;
  uint64_t msg_bytes;
  uint64_t chunk;        // index of this chunk within its message
  uint64_t chunk_bytes;
  uint64_t zero_copy;    // 1: no data in the ring; the receiver copies the message from `shared` (p2p.cpp)
  SharedBuffer shared;
};

// One direction of a p2p pair: the sender posts `sent` (chunks), the receiver posts `acked`.
struct alignas(64) ChanCtl {
  Signal sent;
  Signal acked;
  ChunkMeta meta[2];
};

struct alignas(64) SegHeader {
  uint64_t magic;
  uint64_t nonce;
  uint64_t total_bytes;
  uint64_t buffer_bytes;
  uint64_t p2p_bytes;
  int32_t size;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> aborted;  // 0 = no, 2 = reason being written, 1 = aborted
  char abort_reason[512];
  ProcessId creator;              // rank 0's process: a named segment whose creator died is stale
};

class Segment {
 public:
  // Collective over the local ranks: rank 0 creates, the others attach; returns once this rank is mapped.
  static std::unique_ptr<Segment> connect(const CommConfig& cfg, Bootstrap& bootstrap);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  SegHeader* header() const { return hdr_; }
  RankCtl* ctl(int r) const { return ctl_ + r; }
  ChanCtl* chan(int src, int dst) const { return chan_ + src * size_ + dst; }
  char* slot(int r) const { return slots_ + static_cast<size_t>(r) * buffer_bytes_; }
  char* p2p(int src, int dst) const {
    return p2p_ + (static_cast<size_t>(src) * size_ + dst) * p2p_bytes_;
  }
  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t p2p_bytes() const { return p2p_bytes_; }
  const std::string& shm_name() const { return shm_name_; }

 private:
  Segment() = default;
  void map_layout(void* base, size_t total, int size, size_t buffer_bytes, size_t p2p_bytes);

  void* base_ = nullptr;
  size_t total_ = 0;
  int size_ = 0;
  size_t buffer_bytes_ = 0, p2p_bytes_ = 0;
  SegHeader* hdr_ = nullptr;
  RankCtl* ctl_ = nullptr;
  ChanCtl* chan_ = nullptr;
  char* slots_ = nullptr;
  char* p2p_ = nullptr;
  std::string shm_name_;
};

// "/npudist_<name>" with characters that are not allowed in a shm name replaced (exposed for tests).
std::string shm_segment_name(const std::string& comm_name);

// Unlinks /dev/shm/npudist_* segments left by a crash inside a connect window: their creator process is
// gone (or, if it never finished initialising the header, the file is older than ten minutes). Live
// segments are never touched. Returns how many were removed. Called by rank 0 before creating a segment.
size_t remove_stale_segments();

}  // namespace npudist::shm::detail
