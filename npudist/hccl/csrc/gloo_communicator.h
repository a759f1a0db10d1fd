// GlooCommunicator: the comm::Communicator seam over c10d's ProcessGroupGloo, built from a store. Used between
// nodes (HierarchicalCommunicator) and, with NPUDIST_HCCL_COMMUNICATOR=gloo, for a whole group.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

#include "npudist/communicator.h"

namespace npudist::hccl {

class GlooCommunicator final : public comm::Communicator {
 public:
  // A Gloo group of `size` ranks rendezvousing on `store` (give each group its own PrefixStore).
  static std::unique_ptr<GlooCommunicator> connect(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                   int size, std::chrono::milliseconds timeout);
  GlooCommunicator(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size);

  const char* kind() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  NPUDIST_COMMUNICATOR_OPERATIONS
  // Gloo cannot interrupt a wait in progress (it ends at the Gloo timeout); later calls fail at once.
  void abort(const std::string& reason) override;

 private:
  void check_usable(const char* what);
  void wait(const c10::intrusive_ptr<c10d::Work>& w, const char* what);

  c10::intrusive_ptr<c10d::Backend> gloo_;
  int rank_, size_;
  std::atomic<bool> aborted_{false};
  std::mutex reason_mu_;
  std::string abort_reason_;
};

}  // namespace npudist::hccl
