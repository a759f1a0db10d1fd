// The reduction and gather ops of ProcessGroupHCCL: argument checks (clear ValueErrors on the calling
// rank, before anything is issued), contiguous staging, and an OpSpec whose body calls the engine
// routing in communicator_calls.cpp. all_to_all, gather and scatter are in
// exchange.cpp, p2p in point_to_point.cpp, barriers in barriers.cpp, sparse all_reduce in sparse_all_reduce.cpp.
#include <c10/util/Exception.h>

#include <numeric>

#include "op_utils.h"
#include "process_group_hccl.h"

namespace npudist::hccl {

comm::ElementType element_type_of(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return comm::ElementType::kFloat32;
    case at::kDouble: return comm::ElementType::kFloat64;
    case at::kHalf: return comm::ElementType::kFloat16;
    case at::kBFloat16: return comm::ElementType::kBFloat16;
    case at::kChar: return comm::ElementType::kInt8;
    case at::kByte: return comm::ElementType::kUInt8;
    case at::kShort: return comm::ElementType::kInt16;
    case at::kInt: return comm::ElementType::kInt32;
    case at::kLong: return comm::ElementType::kInt64;
    case at::kBool: return comm::ElementType::kBool;
    case at::kComplexFloat: return comm::ElementType::kComplex64;
    case at::kComplexDouble: return comm::ElementType::kComplex128;
    default:
      TORCH_CHECK_VALUE(false, "hccl ", op, ": dtype ", t,
                        " is not supported; use float32/64, float16, bfloat16, int8/16/32/64, uint8, "
                        "bool or complex64/128");
  }
}

void ProcessGroupHCCL::check_tensor(const at::Tensor& t, const char* op, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), "hccl ", op, ": ", what, " is an undefined tensor");
  const auto dev = t.device().type();
  TORCH_CHECK_VALUE(dev == c10::DeviceType::CPU || dev == c10::DeviceType::PrivateUse1, "hccl ", op,
                    ": ", what, " is on device '", t.device(),
                    "'; the hccl backend takes cpu and npu tensors (move it with .npu() or .cpu())");
  TORCH_CHECK_VALUE(t.layout() == c10::kStrided, "hccl ", op, ": ", what,
                    " is sparse; densify it with .to_dense() first");
  element_type_of(t.scalar_type(), op);
}

void ProcessGroupHCCL::check_rank(int r, const char* op, const char* what) {
  TORCH_CHECK_VALUE(r >= 0 && r < size_, "hccl ", op, ": ", what, " ", r,
                    " is not a rank of this group (valid: 0..", size_ - 1, ")");
}


using namespace ops;

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  check_one(tensors, "all_reduce");
  if (tensors[0].defined() && tensors[0].is_sparse()) return allreduce_sparse_coo(tensors[0], opts);
  at::Tensor t = tensors[0];
  check_tensor(t, "all_reduce", "tensor");
  check_reduce(opts.reduceOp, t.scalar_type(), "all_reduce");
  HCCL_SPEC(s, c10d::OpType::ALLREDUCE, "all_reduce", {t}, {t}, opts.asyncOp);
  s.dtype = c10::toString(t.scalar_type());
  s.reduce_op = reduce_name(opts.reduceOp);
  auto rop = opts.reduceOp;
  s.body = [this, t, rop](uint64_t seq) mutable {
    at::Tensor c = contiguous_of(t);
    do_all_reduce(c, rop, seq, "all_reduce");
    copy_back(t, c);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "hccl allreduce_coalesced: no tensors given");
  for (const auto& t : tensors) {
    check_tensor(t, "allreduce_coalesced", "tensor");
    TORCH_CHECK_VALUE(t.scalar_type() == tensors[0].scalar_type() && t.device() == tensors[0].device(),
                      "hccl allreduce_coalesced: all tensors need one dtype and device, got ",
                      t.scalar_type(), " on ", t.device(), " and ", tensors[0].scalar_type(), " on ",
                      tensors[0].device());
  }
  check_reduce(opts.reduceOp, tensors[0].scalar_type(), "allreduce_coalesced");
  HCCL_SPEC(s, c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, tensors,
            opts.asyncOp);
  s.dtype = c10::toString(tensors[0].scalar_type());
  s.reduce_op = reduce_name(opts.reduceOp);
  auto rop = opts.reduceOp;
  std::vector<at::Tensor> ts = tensors;
  s.body = [this, ts, rop](uint64_t seq) mutable {
    // One engine call over the concatenation: one synchronisation instead of one per tensor.
    at::Tensor flat = flatten(ts);
    do_all_reduce(flat, rop, seq, "allreduce_coalesced");
    unflatten_into(flat, ts);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast");
  at::Tensor t = tensors[0];
  check_tensor(t, "broadcast", "tensor");
  check_rank(static_cast<int>(opts.rootRank), "broadcast", "root");
  HCCL_SPEC(s, c10d::OpType::BROADCAST, "broadcast", {t}, {t}, opts.asyncOp);
  s.dtype = c10::toString(t.scalar_type());
  s.root = static_cast<int>(opts.rootRank);
  const int root = s.root;
  s.body = [this, t, root](uint64_t seq) mutable {
    at::Tensor c = contiguous_of(t);
    do_broadcast(c, root, seq, "broadcast");
    if (rank_ != root) copy_back(t, c);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce");
  at::Tensor t = tensors[0];
  check_tensor(t, "reduce", "tensor");
  check_rank(static_cast<int>(opts.rootRank), "reduce", "root");
  check_reduce(opts.reduceOp, t.scalar_type(), "reduce");
  HCCL_SPEC(s, c10d::OpType::REDUCE, "reduce", {t}, {t}, opts.asyncOp);
  s.dtype = c10::toString(t.scalar_type());
  s.reduce_op = reduce_name(opts.reduceOp);
  s.root = static_cast<int>(opts.rootRank);
  auto rop = opts.reduceOp;
  const int root = s.root;
  s.body = [this, t, rop, root](uint64_t seq) mutable {
    at::Tensor c = contiguous_of(t);
    do_reduce(c, rop, root, seq);
    if (rank_ == root) copy_back(t, c);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& opts) {
  check_tensor(input, "all_gather_into_tensor", "input");
  check_tensor(output, "all_gather_into_tensor", "output");
  check_same_device(output, input, "all_gather_into_tensor");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(),
                    "hccl all_gather_into_tensor: output dtype ", output.scalar_type(),
                    " != input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_,
                    "hccl all_gather_into_tensor: output has ", output.numel(),
                    " elements but needs world_size * input.numel() = ", size_, " * ", input.numel());
  HCCL_SPEC(s, c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {input}, {output},
            opts.asyncOp);
  s.dtype = c10::toString(input.scalar_type());
  at::Tensor in = input, out = output;
  s.body = [this, in, out](uint64_t seq) mutable {
    at::Tensor ci = contiguous_of(in), co = contiguous_of(out);
    do_all_gather(ci, co, seq, "all_gather_into_tensor");
    copy_back(out, co);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  check_one(inputs, "all_gather");
  TORCH_CHECK_VALUE(outputs.size() == 1, "hccl all_gather: expected one output list per process");
  at::Tensor in = inputs[0];
  check_tensor(in, "all_gather", "input");
  auto outs = outputs[0];
  TORCH_CHECK_VALUE(static_cast<int>(outs.size()) == size_, "hccl all_gather: output list has ",
                    outs.size(), " tensors; it needs one per rank (", size_, ")");
  bool uneven = false;
  std::vector<int64_t> recv;
  for (const auto& o : outs) {
    check_tensor(o, "all_gather", "output");
    check_same_device(o, in, "all_gather");
    TORCH_CHECK_VALUE(o.scalar_type() == in.scalar_type(), "hccl all_gather: every output tensor must have the "
                      "input's dtype (", in.scalar_type(), "), got ", o.scalar_type());
    uneven |= o.numel() != in.numel();
    recv.push_back(o.numel());
  }
  // Uneven sizes (NCCL gathers a different size from each rank): output r holds rank r's input.
  TORCH_CHECK_VALUE(outs[rank_].numel() == in.numel(), "hccl all_gather: output ", rank_, " receives this rank's ",
                    "input, so it needs its ", in.numel(), " elements, got ", outs[rank_].numel());
  HCCL_SPEC(s, c10d::OpType::ALLGATHER, "all_gather", {in}, outs, opts.asyncOp);
  s.dtype = c10::toString(in.scalar_type());
  s.body = [this, in, outs, uneven, recv](uint64_t seq) mutable {
    at::Tensor flat = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, in.options());
    if (uneven) {
      // An all_to_all that sends the whole input to every rank (packed, so every communicator takes it).
      const at::Tensor ci = contiguous_of(in).reshape({-1});
      do_all_to_all(ci.repeat({size_}), flat, std::vector<int64_t>(size_, ci.numel()), recv, seq, "all_gather");
    } else {
      do_all_gather(contiguous_of(in), flat, seq, "all_gather");
    }
    unflatten_into(flat, outs);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // torch.distributed.all_gather_coalesced: outputs[r][i] receives rank r's inputs[i] (Gloo's layout).
  TORCH_CHECK_VALUE(!inputs.empty(), "hccl all_gather_coalesced: input_tensor_list is empty");
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_, "hccl all_gather_coalesced: ",
                    outputs.size(), " output lists; it needs one list per rank (", size_, ")");
  for (const auto& in : inputs) {
    check_tensor(in, "all_gather_coalesced", "input");
    check_same_device(in, inputs[0], "all_gather_coalesced");
    TORCH_CHECK_VALUE(in.scalar_type() == inputs[0].scalar_type(),
                      "hccl all_gather_coalesced: all inputs need one dtype, got ", in.scalar_type(),
                      " and ", inputs[0].scalar_type());
  }
  std::vector<at::Tensor> flat_outs;
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK_VALUE(outputs[r].size() == inputs.size(), "hccl all_gather_coalesced: output list ", r,
                      " has ", outputs[r].size(), " tensors; it needs one per input (", inputs.size(), ")");
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& o = outputs[r][i];
      check_tensor(o, "all_gather_coalesced", "output");
      check_same_device(o, inputs[0], "all_gather_coalesced");
      TORCH_CHECK_VALUE(o.numel() == inputs[i].numel() && o.scalar_type() == inputs[i].scalar_type(),
                        "hccl all_gather_coalesced: output_tensor_lists[", r, "][", i, "] must match input ",
                        i, " (", inputs[i].numel(), " elements of ", inputs[i].scalar_type(), "), got ",
                        o.numel(), " of ", o.scalar_type());
      flat_outs.push_back(o);
    }
  }
  HCCL_SPEC(s, c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", inputs, flat_outs,
            opts.asyncOp);
  s.dtype = c10::toString(inputs[0].scalar_type());
  auto ins = inputs;
  s.body = [this, ins, flat_outs](uint64_t seq) mutable {
    // One all_gather of the concatenated inputs: rank r's block holds its inputs in order.
    at::Tensor mine = flatten(ins);
    at::Tensor all = at::empty({mine.numel() * size_}, mine.options());
    do_all_gather(mine, all, seq, "allgather_coalesced");
    unflatten_into(all, flat_outs);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "hccl allgather_into_tensor_coalesced: ",
                    outputs.size(), " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "allgather_into_tensor_coalesced", "input");
    check_tensor(outputs[i], "allgather_into_tensor_coalesced", "output");
    check_same_device(outputs[i], inputs[i], "allgather_into_tensor_coalesced");
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_ &&
                          outputs[i].scalar_type() == inputs[i].scalar_type(),
                      "hccl allgather_into_tensor_coalesced: output ", i,
                      " must hold world_size * input.numel() elements of the input dtype");
  }
  HCCL_SPEC(s, c10d::OpType::COALESCED, "allgather_into_tensor_coalesced", inputs, outputs,
            opts.asyncOp);
  auto ins = inputs, outs = outputs;
  s.body = [this, ins, outs](uint64_t seq) mutable {
    for (size_t i = 0; i < ins.size(); ++i) {
      at::Tensor co = contiguous_of(outs[i]);
      do_all_gather(contiguous_of(ins[i]), co, seq, "allgather_into_tensor_coalesced");
      copy_back(outs[i], co);
    }
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_tensor(input, "reduce_scatter_tensor", "input");
  check_tensor(output, "reduce_scatter_tensor", "output");
  check_same_device(output, input, "reduce_scatter_tensor");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "hccl reduce_scatter_tensor: output dtype ",
                    output.scalar_type(), " != input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "hccl reduce_scatter_tensor: input has ",
                    input.numel(), " elements; it must be world_size * output.numel() = ", size_,
                    " * ", output.numel(), " (pad the input to a multiple of the world size)");
  check_reduce(opts.reduceOp, input.scalar_type(), "reduce_scatter_tensor");
  HCCL_SPEC(s, c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {input}, {output},
            opts.asyncOp);
  s.dtype = c10::toString(input.scalar_type());
  s.reduce_op = reduce_name(opts.reduceOp);
  auto rop = opts.reduceOp;
  at::Tensor in = input, out = output;
  s.body = [this, in, out, rop](uint64_t seq) mutable {
    at::Tensor co = contiguous_of(out);
    do_reduce_scatter(contiguous_of(in), co, rop, seq, "reduce_scatter_tensor");
    copy_back(out, co);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter");
  TORCH_CHECK_VALUE(inputs.size() == 1, "hccl reduce_scatter: expected one input list per process");
  at::Tensor out = outputs[0];
  check_tensor(out, "reduce_scatter", "output");
  auto ins = inputs[0];
  TORCH_CHECK_VALUE(static_cast<int>(ins.size()) == size_, "hccl reduce_scatter: input list has ",
                    ins.size(), " tensors; it needs one per rank (", size_, ")");
  bool uneven = false;
  int64_t offset = 0;  // of this rank's block in the flattened inputs
  for (int j = 0; j < size_; ++j) {
    const at::Tensor& t = ins[j];
    check_tensor(t, "reduce_scatter", "input");
    check_same_device(t, out, "reduce_scatter");
    TORCH_CHECK_VALUE(t.scalar_type() == out.scalar_type(), "hccl reduce_scatter: every input tensor must have the "
                      "output's dtype (", out.scalar_type(), "), got ", t.scalar_type());
    uneven |= t.numel() != out.numel();
    if (j < rank_) offset += t.numel();
  }
  // Uneven sizes (NCCL reduces a different size for each rank): input r is reduced into rank r's output.
  TORCH_CHECK_VALUE(ins[rank_].numel() == out.numel(), "hccl reduce_scatter: input ", rank_, " is reduced into this ",
                    "rank's output, so it needs its ", out.numel(), " elements, got ", ins[rank_].numel());
  check_reduce(opts.reduceOp, out.scalar_type(), "reduce_scatter");
  HCCL_SPEC(s, c10d::OpType::REDUCE_SCATTER, "reduce_scatter", ins, {out}, opts.asyncOp);
  s.dtype = c10::toString(out.scalar_type());
  s.reduce_op = reduce_name(opts.reduceOp);
  auto rop = opts.reduceOp;
  s.body = [this, ins, out, rop, uneven, offset](uint64_t seq) mutable {
    if (uneven) {
      // Reduce every block everywhere and keep this rank's: uneven blocks do not fit the engine's
      // equal-block reduce_scatter, and every rank knows every block's size from its own input list.
      at::Tensor flat = flatten(ins);
      do_all_reduce(flat, rop, seq, "reduce_scatter");
      out.copy_(flat.narrow(0, offset, out.numel()).view(out.sizes()));
      return;
    }
    at::Tensor co = contiguous_of(out);
    do_reduce_scatter(flatten(ins), co, rop, seq, "reduce_scatter");
    copy_back(out, co);
  };
  return issue(std::move(s));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "hccl reduce_scatter_tensor_coalesced: ",
                    outputs.size(), " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "reduce_scatter_tensor_coalesced", "input");
    check_tensor(outputs[i], "reduce_scatter_tensor_coalesced", "output");
    check_same_device(outputs[i], inputs[i], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_ &&
                          outputs[i].scalar_type() == inputs[i].scalar_type(),
                      "hccl reduce_scatter_tensor_coalesced: input ", i,
                      " must hold world_size * output.numel() elements of the output dtype");
    check_reduce(opts.reduceOp, inputs[i].scalar_type(), "reduce_scatter_tensor_coalesced");
  }
  HCCL_SPEC(s, c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, "reduce_scatter_tensor_coalesced",
            inputs, outputs, opts.asyncOp);
  s.reduce_op = reduce_name(opts.reduceOp);
  auto rop = opts.reduceOp;
  auto ins = inputs, outs = outputs;
  s.body = [this, ins, outs, rop](uint64_t seq) mutable {
    for (size_t i = 0; i < ins.size(); ++i) {
      at::Tensor co = contiguous_of(outs[i]);
      do_reduce_scatter(contiguous_of(ins[i]), co, rop, seq, "reduce_scatter_tensor_coalesced");
      copy_back(outs[i], co);
    }
  };
  return issue(std::move(s));
}


}  // namespace npudist::hccl
