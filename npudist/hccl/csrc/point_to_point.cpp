// Point-to-point ops of ProcessGroupHCCL: send/recv (a rank's messages to itself included) and receive from
// any source (non-blocking peeks at each peer's next message, then an ordinary receive).
#include <c10/util/Exception.h>

#include <thread>

#include "op_utils.h"
#include "process_group_hccl.h"

namespace npudist::hccl {

using namespace ops;

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
  return issue(std::move(s));
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
  return issue(std::move(s));
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
  return issue(std::move(s));
}

int WorkHCCL::sourceRank() const {
  TORCH_CHECK(spec_.source, "hccl: source rank is only known for a recv from any source; ", describe(), " is not one");
  const int r = spec_.source->load();
  TORCH_CHECK(r >= 0, "hccl: ", describe(), " has not received yet; wait() on it before asking for its source rank");
  return r;
}

}  // namespace npudist::hccl
