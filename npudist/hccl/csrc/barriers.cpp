// The barriers of ProcessGroupHCCL: barrier() on the communicator, barrier(timeout=...) through the group's
// store (the engine keeps the group's deadline), and monitoredBarrier (through the store, so it can name
// every rank that did not arrive).
#include <c10/util/Exception.h>

#include <sstream>
#include <thread>

#include "op_utils.h"
#include "process_group_hccl.h"

namespace npudist::hccl {

using namespace ops;

namespace {

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream o;
  for (size_t i = 0; i < ranks.size(); ++i) o << (i ? ", " : "") << ranks[i];
  return o.str();
}

// barrier(timeout=...) through the group's store: every rank posts its arrival for `seq` and waits for the
// others up to `timeout`; on expiry raises DistBackendError naming the ranks missing.
void store_barrier(c10d::Store& store, int rank, int size, uint64_t generation, uint64_t seq,
                   std::chrono::milliseconds timeout, const std::string& what) {
  // Sequence numbers restart after reinit: the communicator generation keeps the keys apart.
  const std::string prefix = c10::str("hccl_barrier/", generation == 0 ? std::string() : c10::str("g", generation, "/"),
                                      seq, "/");
  store.set(prefix + std::to_string(rank), std::vector<uint8_t>{1});
  std::vector<std::string> others;
  for (int r = 0; r < size; ++r) {
    if (r != rank) others.push_back(prefix + std::to_string(r));
  }
  try {
    store.wait(others, timeout);
    return;
  } catch (const std::exception&) {
  }
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (r != rank && !store.check({prefix + std::to_string(r)})) missing.push_back(r);
  }
  if (missing.empty()) return;  // the last rank arrived just as the wait expired
  C10_THROW_ERROR(DistBackendError, c10::str("hccl: ", what, " timed out after its timeout of ", timeout.count(),
                                             " ms: ranks [", join_ranks(missing), "] did not arrive"));
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::barrier(const c10d::BarrierOptions& opts) {
  HCCL_SPEC(s, c10d::OpType::BARRIER, "barrier", {}, {}, opts.asyncOp);
  s.body = [this](uint64_t seq) { do_barrier(seq); };
  if (opts.timeout != c10d::kUnsetTimeout) {
    // dist.barrier(timeout=...): the engine keeps the group's deadline, so this one goes through the store.
    const auto timeout = opts.timeout;
    s.body = [this, timeout](uint64_t seq) {
      store_barrier(*store_, rank_, size_, generation_.load(), seq, timeout,
                    c10::str("barrier (seq ", seq, ") on group '", options_->group_name, "' (rank ", rank_, " of ",
                             size_, ")"));
    };
  }
  return issue(std::move(s));
}

// monitoredBarrier: ranks > 0 report to rank 0 through the store and wait for its release; rank 0
// waits for each within the timeout and names the ranks that did not arrive.

void ProcessGroupHCCL::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  check_usable("monitored_barrier");
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const std::string prefix = c10::str("hccl_monitored_barrier/", ++monitored_seq_, "/");
  const std::string where = c10::str(" (hccl group '", options_->group_name, "', timeout ", timeout.count(), " ms)");
  if (rank_ != 0) {
    store_->set(prefix + "arrived/" + std::to_string(rank_), std::vector<uint8_t>{1});
    try {
      store_->wait({prefix + "released"}, timeout);
    } catch (const std::exception&) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str("Rank ", rank_, " successfully reached monitoredBarrier, but rank 0 did not release it",
                               where, "; check rank 0's error for the ranks that failed"));
    }
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 && missing.empty() && !store_->check({prefix + "arrived/" + std::to_string(r)})) {
      C10_THROW_ERROR(DistBackendError, c10::str("Rank 0 timed out in monitoredBarrier waiting for rank ", r, where));
    }
    try {
      // Once a rank is found missing the others get no time beyond the deadline.
      store_->wait({prefix + "arrived/" + std::to_string(r)}, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      missing.push_back(r);
      if (!wait_all_ranks) break;
    }
  }
  if (!missing.empty()) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str(missing.size() == 1 ? "Rank " : "Ranks ", join_ranks(missing),
                             " failed to pass monitoredBarrier", where));
  }
  store_->set(prefix + "released", std::vector<uint8_t>{1});
}

}  // namespace npudist::hccl
