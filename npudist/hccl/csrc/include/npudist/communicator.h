// The communicator seam: what ProcessGroupHCCL needs from a transport, over contiguous buffers, in its own
// vocabulary (element types, reductions, failures). Plain C++17: no torch and no transport header, so an
// Ascend HCCL communicator (HcclAllReduce & co. on an aclrtStream) could implement it as it is.
// One Communicator serves one process group (ranks are group ranks). ProcessGroupHCCL gets its
// implementation from make_communicator (csrc/communicator_factory.h), once, at construction:
//   ShmCommunicator          every rank on one node: the shared-memory engine (npudist/hccl/engine)
//   GlooCommunicator         c10d's Gloo over the group's store (any placement; the inter-node transport)
//   HierarchicalCommunicator several nodes: shm inside each node, Gloo between node leaders and for
//                            the ops that need no reduction (all_to_all, gather, scatter, remote p2p)
//
// Counts are in elements of `t`; `out` may alias `in`. Reductions take a Reduction plus a post-scale
// (AVG of floating types = kSum with 1/size, PREMUL_SUM = kSum with the factor); the process group
// finishes integer AVG itself. Collectives must be issued in the same order on every rank; `info.seq`
// counts them. p2p calls are independent per (peer, direction) and thread-safe across them.
//
// Ordering: every call names the stream it is ordered on. The implementations here are blocking: the call
// runs on the calling thread after the process group has made the work queued before it on `stream`
// visible, and returns when the op is complete (the group's fence on that stream completes with the op).
// An asynchronous implementation enqueues on `stream` and returns; completion is then observed on the
// stream. Failures throw CommError (kind + message); every wait is bounded by the group's timeout.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "npudist/comm_types.h"

namespace npudist::comm {

// The device stream an op is ordered on: the group's comm stream on `device`, or none (device -1) for
// host buffers (cpu tensors).
struct Stream {
  int device = -1;
  int64_t id = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // "shm", "gloo" or "hierarchical" (introspection and error messages).
  virtual const char* kind() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual void all_reduce(const void* in, void* out, size_t count, ElementType t, Reduction op, double scale,
                          const CollectiveInfo& info, const Stream& s) = 0;
  virtual void broadcast(void* buf, size_t count, ElementType t, int root, const CollectiveInfo& info,
                         const Stream& s) = 0;
  // `out` is written on `root` only.
  virtual void reduce(const void* in, void* out, size_t count, ElementType t, Reduction op, double scale,
                      int root, const CollectiveInfo& info, const Stream& s) = 0;
  // `out` holds size() * count elements, rank r's block at r * count.
  virtual void all_gather(const void* in, void* out, size_t count, ElementType t, const CollectiveInfo& info,
                          const Stream& s) = 0;
  // `in` holds size() * count elements; `out` receives this rank's reduced block of `count`.
  virtual void reduce_scatter(const void* in, void* out, size_t count, ElementType t, Reduction op,
                              double scale, const CollectiveInfo& info, const Stream& s) = 0;
  // Element counts and offsets per peer (uneven splits); send_counts[j] on rank i == recv_counts[i] on j.
  // all_to_all_single with even splits is the special case of equal counts.
  virtual void all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets, void* out,
                          const size_t* recv_counts, const size_t* recv_offsets, ElementType t,
                          const CollectiveInfo& info, const Stream& s) = 0;
  // `out` (size() * count elements) is used on `root` only; may be null elsewhere.
  virtual void gather(const void* in, void* out, size_t count, ElementType t, int root,
                      const CollectiveInfo& info, const Stream& s) = 0;
  // `in` (size() * count elements) is used on `root` only; may be null elsewhere.
  virtual void scatter(const void* in, void* out, size_t count, ElementType t, int root,
                       const CollectiveInfo& info, const Stream& s) = 0;
  virtual void barrier(const CollectiveInfo& info, const Stream& s) = 0;
  virtual void send(const void* buf, size_t count, ElementType t, int peer, int tag, const Stream& s) = 0;
  virtual void recv(void* buf, size_t count, ElementType t, int peer, int tag, const Stream& s) = 0;
  // Non-blocking look at `peer`'s next point-to-point message (receive from any source): true and its
  // tag and size in bytes when one has arrived. Only the shared-memory transport can look without
  // receiving; the others refuse, and the process group names the fix (pass src=).
  virtual bool peek(int peer, int64_t* tag, uint64_t* bytes) {
    (void)peer, (void)tag, (void)bytes;
    throw CommError(FailureKind::kInvalidArgument,
                    std::string("receiving from any source needs the shared-memory transport; this group uses ") +
                        kind() + "; pass src=");
  }

  // Makes pending and future calls fail with kAborted as far as the transport allows. Any thread.
  virtual void abort(const std::string& reason) = 0;
  // Collectives that ran zero-copy on the shared-memory path (tests and benchmarks).
  virtual uint64_t zero_copy_ops() const { return 0; }
};

}  // namespace npudist::comm

// Declares the operations of Communicator above as overrides, for the body of an implementation.
#define NPUDIST_COMMUNICATOR_OPERATIONS                                                                          \
  void all_reduce(const void* in, void* out, size_t count, ::npudist::comm::ElementType t,                      \
                  ::npudist::comm::Reduction op, double scale, const ::npudist::comm::CollectiveInfo& info,     \
                  const ::npudist::comm::Stream& s) override;                                                   \
  void broadcast(void* buf, size_t count, ::npudist::comm::ElementType t, int root,                            \
                 const ::npudist::comm::CollectiveInfo& info, const ::npudist::comm::Stream& s) override;       \
  void reduce(const void* in, void* out, size_t count, ::npudist::comm::ElementType t,                          \
              ::npudist::comm::Reduction op, double scale, int root, const ::npudist::comm::CollectiveInfo& info, \
              const ::npudist::comm::Stream& s) override;                                                       \
  void all_gather(const void* in, void* out, size_t count, ::npudist::comm::ElementType t,                      \
                  const ::npudist::comm::CollectiveInfo& info, const ::npudist::comm::Stream& s) override;      \
  void reduce_scatter(const void* in, void* out, size_t count, ::npudist::comm::ElementType t,                  \
                      ::npudist::comm::Reduction op, double scale, const ::npudist::comm::CollectiveInfo& info, \
                      const ::npudist::comm::Stream& s) override;                                               \
  void all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets, void* out,            \
                  const size_t* recv_counts, const size_t* recv_offsets, ::npudist::comm::ElementType t,       \
                  const ::npudist::comm::CollectiveInfo& info, const ::npudist::comm::Stream& s) override;      \
  void gather(const void* in, void* out, size_t count, ::npudist::comm::ElementType t, int root,                \
              const ::npudist::comm::CollectiveInfo& info, const ::npudist::comm::Stream& s) override;          \
  void scatter(const void* in, void* out, size_t count, ::npudist::comm::ElementType t, int root,               \
               const ::npudist::comm::CollectiveInfo& info, const ::npudist::comm::Stream& s) override;         \
  void barrier(const ::npudist::comm::CollectiveInfo& info, const ::npudist::comm::Stream& s) override;         \
  void send(const void* buf, size_t count, ::npudist::comm::ElementType t, int peer, int tag,                   \
            const ::npudist::comm::Stream& s) override;                                                         \
  void recv(void* buf, size_t count, ::npudist::comm::ElementType t, int peer, int tag,                         \
            const ::npudist::comm::Stream& s) override;
