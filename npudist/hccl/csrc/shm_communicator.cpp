// The engine is blocking on the calling thread, so the stream argument only documents the ordering the
// adapter already established (see communicator.h). Data-movement ops convert element counts to bytes.
#include "shm_communicator.h"

#include <vector>

namespace npudist::hccl {

void ShmCommunicator::all_reduce(const void* in, void* out, size_t count, DataType t, ReduceOp op,
                                 double scale, const OpInfo& info, const Stream&) {
  engine_->all_reduce(in, out, count, t, op, info, scale);
}

void ShmCommunicator::broadcast(void* buf, size_t count, DataType t, int root, const OpInfo& info,
                                const Stream&) {
  engine_->broadcast(buf, count * element_size(t), root, info);
}

void ShmCommunicator::reduce(const void* in, void* out, size_t count, DataType t, ReduceOp op, double scale,
                             int root, const OpInfo& info, const Stream&) {
  engine_->reduce(in, out, count, t, op, root, info, scale);
}

void ShmCommunicator::all_gather(const void* in, void* out, size_t count, DataType t, const OpInfo& info,
                                 const Stream&) {
  engine_->all_gather(in, out, count * element_size(t), info);
}

void ShmCommunicator::reduce_scatter(const void* in, void* out, size_t count, DataType t, ReduceOp op,
                                     double scale, const OpInfo& info, const Stream&) {
  engine_->reduce_scatter(in, out, count, t, op, info, scale);
}

void ShmCommunicator::all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets,
                                 void* out, const size_t* recv_counts, const size_t* recv_offsets, DataType t,
                                 const OpInfo& info, const Stream&) {
  const size_t es = element_size(t);
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

void ShmCommunicator::gather(const void* in, void* out, size_t count, DataType t, int root,
                             const OpInfo& info, const Stream&) {
  engine_->gather(in, out, count * element_size(t), root, info);
}

void ShmCommunicator::scatter(const void* in, void* out, size_t count, DataType t, int root,
                              const OpInfo& info, const Stream&) {
  engine_->scatter(in, out, count * element_size(t), root, info);
}

void ShmCommunicator::barrier(const OpInfo& info, const Stream&) { engine_->barrier(info); }

void ShmCommunicator::send(const void* buf, size_t count, DataType t, int peer, int tag, const Stream&) {
  engine_->send(buf, count * element_size(t), peer, tag);
}

void ShmCommunicator::recv(void* buf, size_t count, DataType t, int peer, int tag, const Stream&) {
  engine_->recv(buf, count * element_size(t), peer, tag);
}

}  // namespace npudist::hccl
