// ShmCommunicator: the shared-memory engine (one node) behind the communicator seam. The engine speaks the
// seam's vocabulary (npudist/comm_types.h), so this only converts element counts to the engine's byte
// counts for the data-movement ops and adds the stream argument the blocking engine does not need.
// Torch-free.
#pragma once
#include <memory>

#include "engine.h"
#include "npudist/communicator.h"

namespace npudist::hccl {

class ShmCommunicator final : public comm::Communicator {
 public:
  explicit ShmCommunicator(std::unique_ptr<shm::ShmEngine> engine) : engine_(std::move(engine)) {}

  const char* kind() const override { return "shm"; }
  int rank() const override { return engine_->rank(); }
  int size() const override { return engine_->size(); }

  NPUDIST_COMMUNICATOR_OPERATIONS
  bool peek(int peer, int64_t* tag, uint64_t* bytes) override;
  void abort(const std::string& reason) override { engine_->abort(reason); }
  uint64_t zero_copy_ops() const override { return engine_->zero_copy_ops(); }

 private:
  std::unique_ptr<shm::ShmEngine> engine_;
};

}  // namespace npudist::hccl
