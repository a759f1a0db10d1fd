// all_to_all (single and list), gather, scatter, send/recv and barrier of ProcessGroupHCCL.
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
  return launch(std::move(s));
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
  return launch(std::move(s));
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
  return launch(std::move(s));
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
  return launch(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  check_one(tensors, "send");
  at::Tensor t = tensors[0];
  check_tensor(t, "send", "tensor");
  check_rank(dst, "send", "destination");
  HCCL_SPEC(s, c10d::OpType::SEND, "send", {t}, {}, true);
  s.dtype = c10::toString(t.scalar_type());
  s.p2p = true;
  s.is_send = true;
  s.peer = dst;
  s.body = [this, t, dst, tag](uint64_t) {
    if (dst == rank_) send_to_self(t, tag);
    else do_send(contiguous_of(t), dst, tag);
  };
  return launch(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  check_one(tensors, "recv");
  at::Tensor t = tensors[0];
  check_tensor(t, "recv", "tensor");
  check_rank(src, "recv", "source");
  HCCL_SPEC(s, c10d::OpType::RECV, "recv", {}, {t}, true);
  s.dtype = c10::toString(t.scalar_type());
  s.p2p = true;
  s.peer = src;
  s.body = [this, t, src, tag](uint64_t) mutable {
    if (src == rank_) return recv_from_self(t, tag);
    at::Tensor c = contiguous_of(t);
    do_recv(c, src, tag);
    copy_back(t, c);
  };
  return launch(std::move(s));
}

void ProcessGroupHCCL::send_to_self(const at::Tensor& t, int tag) {
  // A copy, as a send to a peer: the sender may change its tensor once the send completed.
  at::Tensor copy = t.clone(at::MemoryFormat::Contiguous);
  {
    std::lock_guard<std::mutex> g(self_mu_);
    self_box_.push_back(SelfMessage{tag, std::move(copy)});
  }
  self_cv_.notify_all();
}

void ProcessGroupHCCL::recv_from_self(at::Tensor& t, int tag) {
  std::unique_lock<std::mutex> l(self_mu_);
  if (!self_cv_.wait_for(l, timeout_, [&] { return !self_box_.empty(); })) {
    TORCH_CHECK(false, "hccl recv: rank ", rank_, " waited ", timeout_.count(), " ms to receive from itself (tag ",
                tag, ") but sent itself nothing; issue the send before waiting on the recv");
  }
  const SelfMessage& m = self_box_.front();
  TORCH_CHECK_VALUE(m.tag == tag && m.data.numel() == t.numel() && m.data.scalar_type() == t.scalar_type(),
                    "hccl recv: rank ", rank_, " receives from itself ", t.numel(), " elements of ",
                    t.scalar_type(), " with tag ", tag, ", but the next message it sent itself has ",
                    m.data.numel(), " elements of ", m.data.scalar_type(), " with tag ", m.tag,
                    " (messages are matched in order; sizes, dtypes and tags must agree)");
  at::Tensor data = m.data;
  self_box_.pop_front();
  l.unlock();
  t.copy_(data.view(t.sizes()));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::barrier(const c10d::BarrierOptions& opts) {
  HCCL_SPEC(s, c10d::OpType::BARRIER, "barrier", {}, {}, opts.asyncOp);
  s.body = [this](uint64_t seq) { do_barrier(seq); };
  if (opts.timeout != c10d::kUnsetTimeout) {
    // dist.barrier(timeout=...): the engine keeps the group's deadline, so this one goes through the store.
    const auto timeout = opts.timeout;
    s.body = [this, timeout](uint64_t seq) {
      store_barrier(*store_, rank_, size_, seq, timeout,
                    c10::str("barrier (seq ", seq, ") on group '", options_->group_name, "' (rank ", rank_, " of ",
                             size_, ")"));
    };
  }
  return launch(std::move(s));
}


}  // namespace npudist::hccl
