// The engine is blocking on the calling thread, so the stream argument only documents the ordering the
// process group already established (npudist/communicator.h). Data-movement ops convert element counts
// to bytes.
// HOST-MEMORY: npu buffers go to the engine as raw host pointers (it copies them, or maps their memfd
// segments for zero-copy); a device with its own memory would use a device communicator here instead.
#include "shm_communicator.h"

#include <utility>
#include <vector>

namespace npudist::hccl {

namespace {

// The seam's enumerators are declared in the engine's order, so translating is a cast; checked here.
#define NPUDIST_SAME(seam, engine, name) (static_cast<int>(seam::name) == static_cast<int>(engine::name))
#define NPUDIST_SAME_TYPE(name) NPUDIST_SAME(comm::ElementType, DataType, name)
static_assert(NPUDIST_SAME_TYPE(kFloat32) && NPUDIST_SAME_TYPE(kFloat64) && NPUDIST_SAME_TYPE(kFloat16) &&
                  NPUDIST_SAME_TYPE(kBFloat16) && NPUDIST_SAME_TYPE(kInt8) && NPUDIST_SAME_TYPE(kUInt8) &&
                  NPUDIST_SAME_TYPE(kInt16) && NPUDIST_SAME_TYPE(kInt32) && NPUDIST_SAME_TYPE(kInt64) &&
                  NPUDIST_SAME_TYPE(kBool) && NPUDIST_SAME_TYPE(kComplex64) && NPUDIST_SAME_TYPE(kComplex128),
              "comm::ElementType and the engine's DataType must list the same types in the same order");
#define NPUDIST_SAME_OP(name) NPUDIST_SAME(comm::Reduction, ReduceOp, name)
static_assert(NPUDIST_SAME_OP(kSum) && NPUDIST_SAME_OP(kProduct) && NPUDIST_SAME_OP(kMin) && NPUDIST_SAME_OP(kMax) &&
                  NPUDIST_SAME_OP(kBand) && NPUDIST_SAME_OP(kBor) && NPUDIST_SAME_OP(kBxor),
              "comm::Reduction and the engine's ReduceOp must list the same ops in the same order");
#undef NPUDIST_SAME_OP
#undef NPUDIST_SAME_TYPE
#undef NPUDIST_SAME

DataType engine_type(comm::ElementType t) { return static_cast<DataType>(t); }
ReduceOp engine_op(comm::Reduction op) { return static_cast<ReduceOp>(op); }
OpInfo engine_info(const comm::CollectiveInfo& info) { return OpInfo{info.op, info.seq}; }

comm::FailureKind failure_of(ErrorKind k) {
  switch (k) {
    case ErrorKind::kTimeout: return comm::FailureKind::kTimeout;
    case ErrorKind::kPeerDied: return comm::FailureKind::kPeerDied;
    case ErrorKind::kMismatch: return comm::FailureKind::kMismatch;
    case ErrorKind::kAborted: return comm::FailureKind::kAborted;
    case ErrorKind::kInvalidArgument: return comm::FailureKind::kInvalidArgument;
    case ErrorKind::kSystem: return comm::FailureKind::kSystem;
  }
  return comm::FailureKind::kSystem;
}

// Runs one engine call; its EngineError leaves as the seam's CommError (same kind, message and ranks).
template <class F>
auto engine_call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const EngineError& e) {
    throw comm::CommError(failure_of(e.kind), e.what(), e.ranks);
  }
}

}  // namespace

void ShmCommunicator::all_reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                                 double scale, const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_call([&] { engine_->all_reduce(in, out, count, engine_type(t), engine_op(op), engine_info(info), scale); });
}

void ShmCommunicator::broadcast(void* buf, size_t count, comm::ElementType t, int root,
                                const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_call([&] { engine_->broadcast(buf, count * comm::element_bytes(t), root, engine_info(info)); });
}

void ShmCommunicator::reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                             double scale, int root, const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_call([&] {
    engine_->reduce(in, out, count, engine_type(t), engine_op(op), root, engine_info(info), scale);
  });
}

void ShmCommunicator::all_gather(const void* in, void* out, size_t count, comm::ElementType t,
                                 const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_call([&] { engine_->all_gather(in, out, count * comm::element_bytes(t), engine_info(info)); });
}

void ShmCommunicator::reduce_scatter(const void* in, void* out, size_t count, comm::ElementType t,
                                     comm::Reduction op, double scale, const comm::CollectiveInfo& info,
                                     const comm::Stream&) {
  engine_call([&] {
    engine_->reduce_scatter(in, out, count, engine_type(t), engine_op(op), engine_info(info), scale);
  });
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
  engine_call([&] { engine_->all_to_all(in, sc.data(), so.data(), out, rc.data(), ro.data(), engine_info(info)); });
}

void ShmCommunicator::gather(const void* in, void* out, size_t count, comm::ElementType t, int root,
                             const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_call([&] { engine_->gather(in, out, count * comm::element_bytes(t), root, engine_info(info)); });
}

void ShmCommunicator::scatter(const void* in, void* out, size_t count, comm::ElementType t, int root,
                              const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_call([&] { engine_->scatter(in, out, count * comm::element_bytes(t), root, engine_info(info)); });
}

void ShmCommunicator::barrier(const comm::CollectiveInfo& info, const comm::Stream&) {
  engine_call([&] { engine_->barrier(engine_info(info)); });
}

void ShmCommunicator::send(const void* buf, size_t count, comm::ElementType t, int peer, int tag,
                           const comm::Stream&) {
  engine_call([&] { engine_->send(buf, count * comm::element_bytes(t), peer, tag); });
}

void ShmCommunicator::recv(void* buf, size_t count, comm::ElementType t, int peer, int tag, const comm::Stream&) {
  engine_call([&] { engine_->recv(buf, count * comm::element_bytes(t), peer, tag); });
}

bool ShmCommunicator::peek(int peer, int64_t* tag, uint64_t* bytes) {
  return engine_call([&] { return engine_->peek(peer, tag, bytes); });
}

}  // namespace npudist::hccl
