// The engine is blocking on the calling thread, so the stream argument only documents the ordering the
// process group already established (npudist/communicator.h). Data-movement ops convert element counts
// to bytes.
// HOST-MEMORY: npu buffers go to the engine as raw host pointers (it copies them, or maps their memfd
// segments for zero-copy); a device with its own memory would use a device communicator here instead.
#include "shm_communicator.h"

#include <utility>
#include <vector>

namespace npudist::hccl {

void ShmCommunicator::all_reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                                 double scale, const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_->all_reduce(in, out, count, t, op, info, scale);
}

void ShmCommunicator::broadcast(void* buf, size_t count, comm::ElementType t, int root,
                                const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_->broadcast(buf, count * comm::element_bytes(t), root, info);
}

void ShmCommunicator::reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                             double scale, int root, const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_->reduce(in, out, count, t, op, root, info, scale);
}

void ShmCommunicator::all_gather(const void* in, void* out, size_t count, comm::ElementType t,
                                 const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_->all_gather(in, out, count * comm::element_bytes(t), info);
}

void ShmCommunicator::reduce_scatter(const void* in, void* out, size_t count, comm::ElementType t,
                                     comm::Reduction op, double scale, const comm::CollectiveInfo& info,
                                     const comm::Stream&) {
  engine_->reduce_scatter(in, out, count, t, op, info, scale);
}

void ShmCommunicator::all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets,
                                 void* out, const size_t* recv_counts, const size_t* recv_offsets,
                                 comm::ElementType t, const comm::CollectiveInfo& info, const comm::Stream&) {
  const size_t es = comm::element_bytes(t);
  const size_t n = static_cast<size_t>(size());
  std::vector<size_t> sc(n), so(n), rc(n), ro(n);
  for (size_t j = 0; j < n; ++j) {
    sc[j] = send_counts[j] * es;
    so[j] = send_offsets[j] * es;
    rc[j] = recv_counts[j] * es;
    ro[j] = recv_offsets[j] * es;
  }
  engine_->all_to_all(in, sc.data(), so.data(), out, rc.data(), ro.data(), info);
}

void ShmCommunicator::gather(const void* in, void* out, size_t count, comm::ElementType t, int root,
                             const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_->gather(in, out, count * comm::element_bytes(t), root, info);
}

void ShmCommunicator::scatter(const void* in, void* out, size_t count, comm::ElementType t, int root,
                              const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_->scatter(in, out, count * comm::element_bytes(t), root, info);
}

void ShmCommunicator::barrier(const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_->barrier(info);
}

void ShmCommunicator::send(const void* buf, size_t count, comm::ElementType t, int peer, int tag,
                           const comm::Stream&) {
  engine_->send(buf, count * comm::element_bytes(t), peer, tag);
}

void ShmCommunicator::recv(void* buf, size_t count, comm::ElementType t, int peer, int tag, const comm::Stream&) {
  engine_->recv(buf, count * comm::element_bytes(t), peer, tag);
}

bool ShmCommunicator::peek(int peer, int64_t* tag, uint64_t* bytes) {
  return engine_->peek(peer, tag, bytes);
}

}  // namespace npudist::hccl
