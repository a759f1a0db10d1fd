// ShmCommunicator: the Communicator seam over the shared-memory engine (one node). Torch-free.
#pragma once
#include <memory>

#include "communicator.h"

namespace npudist::hccl {

class ShmCommunicator final : public Communicator {
 public:
  explicit ShmCommunicator(std::unique_ptr<ShmEngine> engine) : engine_(std::move(engine)) {}

  const char* kind() const override { return "shm"; }
  int rank() const override { return engine_->rank(); }
  int size() const override { return engine_->size(); }

  void all_reduce(const void* in, void* out, size_t count, DataType t, ReduceOp op, double scale,
                  const OpInfo& info, const Stream& s) override;
  void broadcast(void* buf, size_t count, DataType t, int root, const OpInfo& info, const Stream& s) override;
  void reduce(const void* in, void* out, size_t count, DataType t, ReduceOp op, double scale, int root,
              const OpInfo& info, const Stream& s) override;
  void all_gather(const void* in, void* out, size_t count, DataType t, const OpInfo& info,
                  const Stream& s) override;
  void reduce_scatter(const void* in, void* out, size_t count, DataType t, ReduceOp op, double scale,
                      const OpInfo& info, const Stream& s) override;
  void all_to_all(const void* in, const size_t* send_counts, const size_t* send_offsets, void* out,
                  const size_t* recv_counts, const size_t* recv_offsets, DataType t, const OpInfo& info,
                  const Stream& s) override;
  void gather(const void* in, void* out, size_t count, DataType t, int root, const OpInfo& info,
              const Stream& s) override;
  void scatter(const void* in, void* out, size_t count, DataType t, int root, const OpInfo& info,
               const Stream& s) override;
  void barrier(const OpInfo& info, const Stream& s) override;
  void send(const void* buf, size_t count, DataType t, int peer, int tag, const Stream& s) override;
  void recv(void* buf, size_t count, DataType t, int peer, int tag, const Stream& s) override;
  bool peek(int peer, int64_t* tag, uint64_t* bytes) override { return engine_->peek(peer, tag, bytes); }
  void abort(const std::string& reason) override { engine_->abort(reason); }
  uint64_t zero_copy_ops() const override { return engine_->zero_copy_ops(); }

 private:
  std::unique_ptr<ShmEngine> engine_;
};

}  // namespace npudist::hccl
