// Rebuilding a group's communicator: torch_npu's ProcessGroupHCCL::abortAndClearHcclComm (Python:
// abort_hccl_comm(reason), called by torch_npu.distributed.reinit_process_group after a fault).
//
// The old communicator is aborted (ops pending on it, here and on every peer of the node, fail at once naming
// the reason), its ops drain, and it is dropped. The group object, its options and its name stay. The group's
// next op, of any kind, builds a new communicator with the other ranks (connect() under the store keys of the
// next generation, so no key of an earlier communicator can be read), as torch_npu's next collective creates a
// new HCCL communicator. Sequence numbers restart at 1 on every rank: a rank that skipped a collective before
// the fault does not make every later one a mismatch.
#include <c10/util/Exception.h>

#include "process_group_hccl.h"

namespace npudist::hccl {

void ProcessGroupHCCL::abort_and_clear_comm(const std::string& reason) {
  // No op is issued, nor runs on a caller's thread (synchronous ops run under issue_mu_), meanwhile.
  std::lock_guard<std::mutex> issuing(issue_mu_);
  TORCH_CHECK(!terminated_, "hccl: abort_hccl_comm on group '", options_->group_name,
              "' after it was shut down or destroyed; create a new group instead");
  // A second call before the rebuild changes nothing: there is no communicator to abort, and the ranks meet
  // under the generation the first call started.
  if (needs_connect_) return;
  const std::string why =
      c10::str("abort_hccl_comm(", reason.empty() ? std::string("reinit") : reason, ") on rank ", global_rank_,
               ": the communicator of group '", options_->group_name,
               "' is being rebuilt; every rank of the group must call "
               "torch_npu.distributed.reinit_process_group(group) before its next op on the group");
  {
    std::lock_guard<std::mutex> g(comm_mu_);
    // Failures of the ops pending now belong to a communicator the caller discarded: the watchdog compares
    // generations and never tears the process down for them.
    generation_.fetch_add(1);
    abort_reason_ = why;
    aborted_ = true;
    if (comm_) comm_->abort(why);
  }
  // Every queued or running op now fails fast (execute() sees aborted_, the engine's waits see the abort).
  coll_lane_.drain();
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    for (auto& kv : p2p_lanes_) kv.second->drain();
  }
  std::unique_ptr<comm::Communicator> old;
  {
    std::lock_guard<std::mutex> g(comm_mu_);
    old = std::move(comm_);
    seq_ = 0;
    p2p_seq_ = 0;
    error_type_ = 0;
    abort_reason_.clear();
    aborted_ = false;
    needs_connect_ = true;
  }
  old.reset();
  // CANN frees a destroyed communicator's device buffers; the new one charges them at its first npu op.
  release_device_buffers();
}

void ProcessGroupHCCL::reconnect(const char* op) {
  rebuild_op_ = op;
  // On failure needs_connect_ stays set: this rank's next op meets the others again under the same keys.
  connect();
  rebuild_op_ = nullptr;
  needs_connect_ = false;
}

}  // namespace npudist::hccl
