// Ops Gloo offers beyond the core collectives, composed from ProcessGroupHCCL's own building blocks:
// sparse COO all_reduce (all_gather of sizes, then of indices and values, then coalesce), receive
// from any source (non-blocking peeks at each peer's next message, then an ordinary receive), and
// monitoredBarrier (through the group's store, so it can name every rank that did not arrive).
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>
#include <thread>

#include "op_utils.h"
#include "process_group_hccl.h"

namespace npudist::hccl {

using namespace ops;

namespace {

// Header exchanged before a sparse all_reduce: nnz, ndim, sparse_dim, then the sizes.
constexpr int64_t kSparseMaxDims = 32;
constexpr int64_t kSparseHeader = 3 + kSparseMaxDims;

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream o;
  for (size_t i = 0; i < ranks.size(); ++i) o << (i ? ", " : "") << ranks[i];
  return o.str();
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Sparse COO all_reduce (Gloo semantics: SUM; the input is replaced by the coalesced sum).

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allreduce_sparse_coo(const at::Tensor& input,
                                                                      const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(input.layout() == c10::kSparse, "hccl all_reduce: only sparse COO tensors are supported, got ",
                    input.layout(), "; convert with .to_sparse() or .to_dense()");
  TORCH_CHECK_VALUE(input.device().is_cpu(), "hccl all_reduce: sparse tensors must be on cpu, got ",
                    input.device(), "; move it with .cpu()");
  TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM, "hccl all_reduce: sparse tensors support ReduceOp.SUM only, got ",
                    reduce_name(opts.reduceOp), "; densify with .to_dense() for other reductions");
  TORCH_CHECK_VALUE(input.dim() <= kSparseMaxDims, "hccl all_reduce: sparse tensors with more than ",
                    kSparseMaxDims, " dims are not supported, got ", input.dim());
  element_type_of(input.scalar_type(), "all_reduce");
  at::Tensor t = input;
  HCCL_SPEC(s, c10d::OpType::ALLREDUCE, "all_reduce_sparse", {t}, {t}, opts.asyncOp);
  s.dtype = c10::toString(t.scalar_type());
  s.reduce_op = "SUM";
  s.body = [this, t](uint64_t seq) mutable {
    at::Tensor mine = t.coalesce();
    at::Tensor idx = mine.indices();  // [sparse_dim, nnz] int64
    at::Tensor vals = mine.values();  // [nnz, dense sizes...]
    const int64_t nnz = mine._nnz();
    // 1. Every rank's nnz and shape.
    at::Tensor head = at::zeros({kSparseHeader}, at::kLong);
    auto* h = head.data_ptr<int64_t>();
    h[0] = nnz;
    h[1] = mine.dim();
    h[2] = mine.sparse_dim();
    for (int64_t d = 0; d < mine.dim(); ++d) h[3 + d] = mine.size(d);
    at::Tensor heads = at::empty({kSparseHeader * size_}, at::kLong);
    do_all_gather(head, heads, seq, "all_reduce_sparse");
    const auto* hs = heads.data_ptr<int64_t>();
    int64_t max_nnz = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t* hr = hs + r * kSparseHeader;
      TORCH_CHECK_VALUE(std::equal(hr + 1, hr + kSparseHeader, h + 1), "hccl all_reduce: sparse tensor of rank ", r,
                        " differs in shape or sparse_dim from rank ", rank_, "'s ", mine.sizes(),
                        " (sparse_dim ", mine.sparse_dim(), "); every rank needs the same sizes");
      max_nnz = std::max(max_nnz, hr[0]);
    }
    // 2. Indices and values, padded to the largest nnz.
    const int64_t sd = mine.sparse_dim();
    at::Tensor idx_pad = at::zeros({sd, max_nnz}, at::kLong);
    idx_pad.narrow(1, 0, nnz).copy_(idx);
    std::vector<int64_t> vshape(vals.sizes().begin(), vals.sizes().end());
    vshape[0] = max_nnz;
    at::Tensor val_pad = at::zeros(vshape, vals.options());
    val_pad.narrow(0, 0, nnz).copy_(vals);
    at::Tensor all_idx = at::empty({size_ * idx_pad.numel()}, at::kLong);
    at::Tensor all_val = at::empty({size_ * val_pad.numel()}, vals.options());
    do_all_gather(idx_pad.reshape({-1}), all_idx, seq, "all_reduce_sparse");
    do_all_gather(val_pad.reshape({-1}), all_val, seq, "all_reduce_sparse");
    // 3. Concatenate every rank's entries and sum duplicates, in rank order on every rank.
    std::vector<at::Tensor> idx_parts, val_parts;
    std::vector<int64_t> vfull = vshape;
    vfull.insert(vfull.begin(), size_);
    at::Tensor all_val_v = all_val.view(vfull);
    at::Tensor all_idx_v = all_idx.view({size_, sd, max_nnz});
    for (int r = 0; r < size_; ++r) {
      const int64_t n = hs[r * kSparseHeader];
      idx_parts.push_back(all_idx_v[r].narrow(1, 0, n));
      val_parts.push_back(all_val_v[r].narrow(0, 0, n));
    }
    at::Tensor sum = at::sparse_coo_tensor(at::cat(idx_parts, 1), at::cat(val_parts, 0), mine.sizes(),
                                           mine.options())
                         .coalesce();
    t.copy_(sum);
  };
  return launch(std::move(s));
}

// ------------------------------------------------------------------------------------------------
// Receive from any source.

int ProcessGroupHCCL::recv_any(at::Tensor& t, int tag) {
  const auto& locals = topo_.local_ranks();
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto pause = std::chrono::microseconds(20);
  size_t start = 0;  // rotates so one busy sender cannot starve the others
  while (true) {
    for (size_t k = 0; k < locals.size(); ++k) {
      const size_t i = (start + k) % locals.size();
      if (static_cast<int>(i) == topo_.local_rank) continue;
      int64_t ptag = 0;
      uint64_t pbytes = 0;
      if (comm_->peek(static_cast<int>(i), &ptag, &pbytes) && ptag == tag) {
        // A size mismatch surfaces from the receive as the usual mismatch error naming the sender.
        do_recv(t, locals[i], tag);
        return locals[i];
      }
    }
    start = (start + 1) % locals.size();
    if (aborted_) throw comm::CommError(comm::FailureKind::kAborted, "group was aborted: " + abort_reason_);
    if (std::chrono::steady_clock::now() >= deadline) {
      throw comm::CommError(comm::FailureKind::kTimeout,
                            c10::str("npudist engine: no rank sent a message with tag ", tag, " to rank ", rank_,
                                     " within ", timeout_.count(), " ms"));
    }
    // Sleep rather than spin: the sender may need this core.
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  check_one(tensors, "recv");
  at::Tensor t = tensors[0];
  check_tensor(t, "recv", "tensor");
  TORCH_CHECK_VALUE(topo_.num_nodes() == 1, "hccl recv: receiving from any source works inside one node; this group spans ",
                    topo_.num_nodes(), " nodes; pass src=");
  TORCH_CHECK_VALUE(size_ > 1, "hccl recv: a group of one rank has no other rank to receive from");
  HCCL_SPEC(s, c10d::OpType::RECVANYSOURCE, "recv_anysource", {}, {t}, true);
  s.dtype = c10::toString(t.scalar_type());
  s.p2p = true;
  s.peer = -1;  // its own lane: it must not wait behind a receive from one particular peer
  auto source = std::make_shared<std::atomic<int>>(-1);
  s.source = source;
  s.body = [this, t, tag, source](uint64_t) mutable {
    at::Tensor c = contiguous_of(t);
    const int src = recv_any(c, tag);
    copy_back(t, c);
    source->store(src);
  };
  return launch(std::move(s));
}

int WorkHCCL::sourceRank() const {
  TORCH_CHECK(spec_.source, "hccl: source rank is only known for a recv from any source; ", describe(), " is not one");
  const int r = spec_.source->load();
  TORCH_CHECK(r >= 0, "hccl: ", describe(), " has not received yet; wait() on it before asking for its source rank");
  return r;
}

// ------------------------------------------------------------------------------------------------
// barrier(timeout=...)

namespace ops {

void store_barrier(c10d::Store& store, int rank, int size, uint64_t seq, std::chrono::milliseconds timeout,
                   const std::string& what) {
  const std::string prefix = c10::str("hccl_barrier/", seq, "/");
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

}  // namespace ops

// ------------------------------------------------------------------------------------------------
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
