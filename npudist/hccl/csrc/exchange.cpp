// The exchange ops of ProcessGroupHCCL: all_to_all (single and list), gather and scatter.
#include <functional>
#include <numeric>

#include "op_utils.h"
#include "process_group_hccl.h"

namespace npudist::hccl {

using namespace ops;

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& output_splits,
                                                               std::vector<int64_t>& input_splits,
                                                               const c10d::AllToAllOptions& opts) {
  check_tensor(input, "all_to_all_single", "input");
  check_tensor(output, "all_to_all_single", "output");
  check_same_device(output, input, "all_to_all_single");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "hccl all_to_all_single: output dtype ",
                    output.scalar_type(), " != input dtype ", input.scalar_type());
  auto rows_to_elems = [&](const at::Tensor& t, std::vector<int64_t> splits, const char* what) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t row_elems = rows == 0 ? 0 : t.numel() / rows;
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % size_ == 0, "hccl all_to_all_single: ", what, " dim 0 (", rows,
                        ") is not divisible by the world size ", size_, "; pass ", what,
                        "_split_sizes");
      splits.assign(size_, rows / size_);
    }
    TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size_, "hccl all_to_all_single: ", what,
                      "_split_sizes has ", splits.size(), " entries; it needs one per rank (", size_, ")");
    int64_t total = 0;
    for (auto v : splits) {
      TORCH_CHECK_VALUE(v >= 0, "hccl all_to_all_single: negative split size in ", what, "_split_sizes");
      total += v;
    }
    TORCH_CHECK_VALUE(total == rows, "hccl all_to_all_single: ", what, "_split_sizes sum to ", total,
                      " but the ", what, " has ", rows, " rows in dim 0");
    for (auto& v : splits) v *= row_elems;
    return splits;
  };
  auto send = rows_to_elems(input, input_splits, "input");
  auto recv = rows_to_elems(output, output_splits, "output");
  HCCL_SPEC(s, c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {input}, {output}, opts.asyncOp);
  s.dtype = c10::toString(input.scalar_type());
  at::Tensor in = input, out = output;
  s.body = [this, in, out, send, recv](uint64_t seq) mutable {
    at::Tensor co = contiguous_of(out);
    do_all_to_all(contiguous_of(in), co, send, recv, seq, "all_to_all_single");
    copy_back(out, co);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
                    "hccl all_to_all: input and output lists need one tensor per rank (", size_,
                    "), got ", inputs.size(), " and ", outputs.size());
  std::vector<int64_t> send, recv;
  for (int i = 0; i < size_; ++i) {
    check_tensor(inputs[i], "all_to_all", "input");
    check_tensor(outputs[i], "all_to_all", "output");
    check_same_device(inputs[i], inputs[0], "all_to_all");
    check_same_device(outputs[i], inputs[0], "all_to_all");
    TORCH_CHECK_VALUE(inputs[i].scalar_type() == inputs[0].scalar_type() &&
                          outputs[i].scalar_type() == inputs[0].scalar_type(),
                      "hccl all_to_all: all tensors need one dtype");
    send.push_back(inputs[i].numel());
    recv.push_back(outputs[i].numel());
  }
  HCCL_SPEC(s, c10d::OpType::ALLTOALL, "all_to_all", inputs, outputs, opts.asyncOp);
  s.dtype = c10::toString(inputs[0].scalar_type());
  auto ins = inputs, outs = outputs;
  s.body = [this, ins, outs, send, recv](uint64_t seq) mutable {
    const int64_t total = std::accumulate(recv.begin(), recv.end(), int64_t{0});
    at::Tensor out_flat = at::empty({total}, outs[0].options());
    do_all_to_all(flatten(ins), out_flat, send, recv, seq, "all_to_all");
    unflatten_into(out_flat, outs);
  };
  return issue(std::move(s));
}

namespace {

// The root's gather_list / scatter_list: one tensor per rank, each like `ref` (`ref_name` in messages);
// the other ranks pass none.
std::vector<at::Tensor> root_list(const std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& ref,
                                  bool is_root, int root, int size, const char* op, const char* list,
                                  const char* ref_name, const std::function<void(const at::Tensor&)>& check) {
  if (!is_root) {
    TORCH_CHECK_VALUE(lists.empty() || lists[0].empty(),
                      "hccl ", op, ": only the root (rank ", root, ") may pass a ", list);
    return {};
  }
  TORCH_CHECK_VALUE(lists.size() == 1 && static_cast<int>(lists[0].size()) == size,
                    "hccl ", op, ": the root needs a ", list, " with one tensor per rank (", size, ")");
  for (const auto& t : lists[0]) {
    check(t);
    check_same_device(t, ref, op);
    TORCH_CHECK_VALUE(t.numel() == ref.numel() && t.scalar_type() == ref.scalar_type(),
                      "hccl ", op, ": ", list, " tensors must match the ", ref_name, " (", ref.numel(),
                      " elements of ", ref.scalar_type(), ")");
  }
  return lists[0];
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  check_one(inputs, "gather");
  at::Tensor in = inputs[0];
  check_tensor(in, "gather", "input");
  const int root = static_cast<int>(opts.rootRank);
  check_rank(root, "gather", "root");
  auto check = [this](const at::Tensor& t) { check_tensor(t, "gather", "gather_list entry"); };
  std::vector<at::Tensor> outs =
      root_list(outputs, in, rank_ == root, root, size_, "gather", "gather_list", "input", check);
  HCCL_SPEC(s, c10d::OpType::GATHER, "gather", {in}, outs, opts.asyncOp);
  s.dtype = c10::toString(in.scalar_type());
  s.root = root;
  s.body = [this, in, outs, root](uint64_t seq) mutable {
    if (rank_ == root) {
      at::Tensor flat = at::empty({in.numel() * size_}, in.options());
      do_gather(contiguous_of(in), &flat, root, seq);
      unflatten_into(flat, outs);
    } else {
      do_gather(contiguous_of(in), nullptr, root, seq);
    }
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter");
  at::Tensor out = outputs[0];
  check_tensor(out, "scatter", "output");
  const int root = static_cast<int>(opts.rootRank);
  check_rank(root, "scatter", "root");
  auto check = [this](const at::Tensor& t) { check_tensor(t, "scatter", "scatter_list entry"); };
  std::vector<at::Tensor> ins =
      root_list(inputs, out, rank_ == root, root, size_, "scatter", "scatter_list", "output", check);
  HCCL_SPEC(s, c10d::OpType::SCATTER, "scatter", ins, {out}, opts.asyncOp);
  s.dtype = c10::toString(out.scalar_type());
  s.root = root;
  s.body = [this, ins, out, root](uint64_t seq) mutable {
    at::Tensor co = contiguous_of(out);
    if (rank_ == root) {
      at::Tensor flat = flatten(ins);
      do_scatter(&flat, co, root, seq);
    } else {
      do_scatter(nullptr, co, root, seq);
    }
    copy_back(out, co);
  };
  return issue(std::move(s));
}

}  // namespace npudist::hccl
