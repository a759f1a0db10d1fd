// Sparse COO all_reduce with Gloo's semantics (SUM; the input is replaced by the coalesced sum), composed
// from ProcessGroupHCCL's own collectives: an all_gather of every rank's nnz and shape, then of indices and
// values, then coalesce.
#include <c10/util/Exception.h>

#include <algorithm>

#include "op_utils.h"
#include "process_group_hccl.h"

namespace npudist::hccl {

using namespace ops;

namespace {

// Header exchanged before a sparse all_reduce: nnz, ndim, sparse_dim, then the sizes.
constexpr int64_t kSparseMaxDims = 32;
constexpr int64_t kSparseHeader = 3 + kSparseMaxDims;

}  // namespace

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
  return issue(std::move(s));
}

}  // namespace npudist::hccl
