// ShmCommunicator: the shared-memory engine (one node) adapted to the communicator seam. The only place
// where the seam's vocabulary meets the engine's (engine.h): element types, reductions and descriptors
// are translated on the way in, EngineError becomes CommError on the way out. Torch-free.
#pragma once
#include <memory>

#include "engine.h"
#include "npudist/communicator.h"

namespace npudist::hccl {

class ShmCommunicator final : public comm::Communicator {
 public:
  explicit ShmCommunicator(std::unique_ptr<ShmEngine> engine) : engine_(std::move(engine)) {}

  const char* kind() const override { return "shm"; }
  int rank() const override { return engine_->rank(); }
  int size() const override { return engine_->size(); }

  void all_reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                  double scale, const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void broadcast(void* buf, size_t count, comm::ElementType t, int root, const comm::CollectiveInfo& info,
                 const comm::Stream& s) override;
  void reduce(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op, double scale,
              int root, const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void all_gather(const void* in, void* out, size_t count, comm::ElementType t, const comm::CollectiveInfo& info,
                  const comm::Stream& s) override;
  void reduce_scatter(const void* in, void* out, size_t count, comm::ElementType t, comm::Reduction op,
                      double scale, const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets, void* out,
                  const size_t* recv_counts, const size_t* recv_offsets, comm::ElementType t,
                  const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void gather(const void* in, void* out, size_t count, comm::ElementType t, int root,
              const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void scatter(const void* in, void* out, size_t count, comm::ElementType t, int root,
               const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void barrier(const comm::CollectiveInfo& info, const comm::Stream& s) override;
  void send(const void* buf, size_t count, comm::ElementType t, int peer, int tag, const comm::Stream& s) override;
  void recv(void* buf, size_t count, comm::ElementType t, int peer, int tag, const comm::Stream& s) override;
  bool peek(int peer, int64_t* tag, uint64_t* bytes) override;
  void abort(const std::string& reason) override { engine_->abort(reason); }
  uint64_t zero_copy_ops() const override { return engine_->zero_copy_ops(); }

 private:
  std::unique_ptr<ShmEngine> engine_;
};

}  // namespace npudist::hccl
