// npudist collective engine: the public API. Plain C++17, no torch headers.
//
// A ShmEngine connects the ranks of one process group that live on the same node through POSIX
// shared memory. All buffers are raw host pointers (npu memory is host memory); counts are in elements
// of `dtype`, byte sizes in bytes. Every call is blocking on the calling thread and must be issued in the
// same order on every local rank (collective semantics); p2p calls are independent per (peer, tag).
// Every wait is bounded by the communicator timeout and fails with CommError (never hangs).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "npudist/comm_types.h"

namespace npudist::shm {

// The engine speaks the collective vocabulary of the communicator seam (npudist/comm_types.h): element
// types, reductions (AVG and PREMUL_SUM are kSum plus a post-scale, see `scale` below), CommError with its
// FailureKind and the ranks it is about (CommConfig::global_ranks numbering when that was given, else local
// ranks), and CollectiveInfo, every rank's of which are compared (mismatch detection).
using comm::CollectiveInfo;
using comm::CommError;
using comm::ElementType;
using comm::FailureKind;
using comm::Reduction;

// Out-of-band exchange used only while connecting (implemented by the adapter over the c10d Store,
// by tests over threads or pipes). get() blocks until the key exists or the timeout passes.
struct Bootstrap {
  virtual ~Bootstrap() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key) = 0;
};

// A buffer inside memory another process on the node can map (a memfd segment of the npu allocator):
// the engine's peers map it through /proc/<pid>/fd/<fd> and read/write it in place (zero-copy).
struct SharedBuffer {
  int32_t fd = -1;
  uint64_t segment_id = 0;    // unique per process
  uint64_t segment_size = 0;
  uint64_t offset = 0;        // of the buffer in the segment
  uint64_t epoch = 0;         // segments the owner has released so far (peers drop stale mappings)
};
// Returns true and fills *out if [ptr, ptr + bytes) is shareable.
using SharedResolver = std::function<bool(const void* ptr, size_t bytes, SharedBuffer* out)>;

struct CommConfig {
  std::string name;          // unique per job and group; used in shm segment names (/npudist_<name>_...)
  int rank = 0;              // rank among the local ranks of this communicator
  int size = 1;
  size_t buffer_bytes = 8u << 20;  // per-rank staging buffer (HCCL_BUFFSIZE)
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // Optional (additive): global rank of each local rank, used only to name ranks in error messages.
  std::vector<int> global_ranks;
  // Optional (additive): resolves buffers in shareable memory. When every local rank has one and can map
  // the others' memfds (probed at connect), large all_reduce, reduce_scatter, all_gather, broadcast and
  // all_to_all whose buffers are shareable on every rank run zero-copy: each rank reads (and for
  // all_reduce writes) the peers' buffers in place, one copy per byte and two syncs per op.
  SharedResolver shared_resolver;
};

// `CollectiveInfo::seq` must count the collectives of the group identically on every rank (not p2p): the
// engine compares it across ranks, so a rank that skipped a collective is reported instead of silently
// pairing with the next one.
class ShmEngine {
 public:
  // Creates/attaches the shared-memory segments (collective over the local ranks).
  static std::unique_ptr<ShmEngine> connect(const CommConfig& cfg, Bootstrap& bootstrap);
  virtual ~ShmEngine() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // out may alias in. `scale` != 1 multiplies the reduced result (AVG: 1/size; PREMUL_SUM: factor
  // applied by the adapter beforehand or here). fp16/bf16 accumulate in fp32.
  virtual void all_reduce(const void* in, void* out, size_t count, ElementType t, Reduction op,
                          const CollectiveInfo& info, double scale = 1.0) = 0;
  virtual void reduce(const void* in, void* out, size_t count, ElementType t, Reduction op, int root,
                      const CollectiveInfo& info, double scale = 1.0) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root, const CollectiveInfo& info) = 0;
  // out holds size()*bytes, rank r's contribution at offset r*bytes.
  virtual void all_gather(const void* in, void* out, size_t bytes, const CollectiveInfo& info) = 0;
  // in holds size()*count elements; out receives this rank's reduced chunk of `count` elements.
  virtual void reduce_scatter(const void* in, void* out, size_t count, ElementType t, Reduction op,
                              const CollectiveInfo& info, double scale = 1.0) = 0;
  // Byte counts/offsets per peer (uneven splits allowed); send_counts[j] on rank i == recv_counts[i] on j.
  virtual void all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets,
                          void* out, const size_t* recv_counts, const size_t* recv_offsets,
                          const CollectiveInfo& info) = 0;
  virtual void gather(const void* in, void* out, size_t bytes, int root, const CollectiveInfo& info) = 0;
  virtual void scatter(const void* in, void* out, size_t bytes, int root, const CollectiveInfo& info) = 0;
  virtual void barrier(const CollectiveInfo& info) = 0;

  // Point-to-point; thread-safe across different (peer, direction) pairs so sends and receives to
  // several peers can run concurrently on different threads. Matched by (peer, tag) in order.
  virtual void send(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* buf, size_t bytes, int peer, int tag) = 0;
  // Non-blocking look at the next message from `peer` (any-source receive): true and its tag and
  // size when one has arrived, false otherwise. Called by the one thread that receives from `peer`.
  virtual bool peek(int peer, int64_t* tag, uint64_t* bytes) = 0;

  // Makes every pending and future wait of every local rank fail with kAborted. Safe from any thread.
  virtual void abort(const std::string& reason) = 0;

  // How many collectives and p2p receives ran zero-copy so far (see CommConfig::shared_resolver; p2p: messages
  // larger than the ring whose send buffer is shareable). For tests and benchmarks.
  virtual uint64_t zero_copy_ops() const { return 0; }
};

}  // namespace npudist::shm
