// The newer c10d Backend capabilities, as ProcessGroupNCCL offers them:
// * coalescing: startCoalescing() .. endCoalescing() returns one Work for every op issued in between
//   (torch's _coalescing_manager(group, device) and, because supportsCoalescing() is true,
//   batch_isend_irecv). The ops themselves run as they would alone: the engine needs no grouped call
//   (NCCL's ncclGroupStart/End).
// * shrink: a new group of the remaining ranks (torch.distributed.shrink_group), made like split().
// * allocateTensor: memory for communication buffers (FSDP2's
//   set_allocate_memory_from_process_group_for_comm). The npu caching allocator's fixed segments are the
//   memory the engine maps across local ranks, so the buffers are ordinary npu tensors.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "process_group_hccl.h"

namespace npudist::hccl {
namespace {

// One Work for the ops of a coalesced group: complete when all are, failed if any failed.
class CoalescedWorkHCCL : public c10d::Work {
 public:
  explicit CoalescedWorkHCCL(std::vector<c10::intrusive_ptr<c10d::Work>> works)
      : c10d::Work(-1, c10d::OpType::COALESCED), works_(std::move(works)) {}

  bool isCompleted() override {
    return std::all_of(works_.begin(), works_.end(), [](const auto& w) { return w->isCompleted(); });
  }
  bool isSuccess() const override {
    return std::all_of(works_.begin(), works_.end(), [](const auto& w) { return w->isSuccess(); });
  }
  std::exception_ptr exception() const override {
    for (const auto& w : works_) {
      if (auto e = w->exception()) return e;
    }
    return nullptr;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& w : works_) w->wait(timeout);
    return true;
  }
  void synchronize() override {
    for (auto& w : works_) w->synchronize();
  }
  void abort() override {
    for (auto& w : works_) w->abort();
  }
  std::vector<at::Tensor> result() override {
    std::vector<at::Tensor> all;
    for (auto& w : works_) {
      auto r = w->result();
      all.insert(all.end(), r.begin(), r.end());
    }
    return all;
  }
  // Completes when every op's future has, with all their output tensors (in issue order); on npu its
  // value is ordered on the streams the ops' futures are (the children's devices).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> g(mu_);
    if (future_) return future_;
    std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
    std::vector<c10::Device> devices;
    for (auto& w : works_) {
      futures.push_back(w->getFuture());
      for (const auto& d : futures.back()->devices()) {
        if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
      }
    }
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    if (futures.empty()) {
      future_->markCompleted(c10::IValue(c10::List<at::Tensor>()));
      return future_;
    }
    struct State {
      std::atomic<size_t> remaining;
      std::atomic<bool> finished{false};
      std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
    };
    auto state = std::make_shared<State>();
    state->remaining = futures.size();
    state->futures = futures;
    auto all = future_;
    for (auto& f : futures) {
      f->addCallback([state, all](c10::ivalue::Future& done) {
        if (done.hasError()) {
          if (!state->finished.exchange(true)) all->setError(done.exception_ptr());
          return;
        }
        if (--state->remaining != 0 || state->finished.exchange(true)) return;
        c10::List<at::Tensor> values;
        for (const auto& child : state->futures) {
          for (const auto& v : child->value().toTensorVector()) values.push_back(v);
        }
        all->markCompleted(c10::IValue(values));
      });
    }
    return future_;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::mutex mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

void ProcessGroupHCCL::startCoalescing() {
  std::lock_guard<std::mutex> issue(issue_mu_);
  TORCH_CHECK(!coalescing_,
              "hccl: startCoalescing() called while a coalescing group is open on this process group; "
              "end it with endCoalescing() first (torch's _coalescing_manager does)");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> issue(issue_mu_);
    TORCH_CHECK(coalescing_, "hccl: endCoalescing() without startCoalescing() on this process group");
    coalescing_ = false;
    works.swap(coalesced_);
  }
  // As ProcessGroupNCCL: no op issued, no Work (torch's _coalescing_manager then has nothing to wait for).
  if (works.empty()) return nullptr;
  return c10::make_intrusive<CoalescedWorkHCCL>(std::move(works));
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupHCCL::shrink(
    const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts_override) {
  for (int64_t r : ranks_to_exclude) {
    TORCH_CHECK_VALUE(r >= 0 && r < size_, "hccl: shrink: rank ", r, " is not in the group of ", size_,
                      " ranks (group ranks, 0.. ", size_ - 1, ")");
    TORCH_CHECK_VALUE(r != rank_, "hccl: shrink: rank ", rank_,
                      " is excluded and must not take part in the shrink (only the remaining ranks call it)");
  }
  std::vector<int> remaining;
  for (int r = 0; r < size_; ++r) {
    if (std::find(ranks_to_exclude.begin(), ranks_to_exclude.end(), r) == ranks_to_exclude.end()) {
      remaining.push_back(r);
    }
  }
  TORCH_CHECK_VALUE(!remaining.empty(), "hccl: shrink: every rank is excluded");
  // SHRINK_ABORT (1): end this group's pending ops first (an excluded rank may never finish them). The group
  // is unusable afterwards, as a communicator aborted by ncclCommShrink's abort flag is.
  if (shrink_flags & 1) abort();
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> issue(issue_mu_);
    n = ++shrinks_;  // every remaining rank shrinks this group in the same order: the same prefix
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>("shrink/" + std::to_string(n) + "/", store_);
  return split(store, remaining, opts_override);
}

at::Tensor ProcessGroupHCCL::allocateTensor(long size, at::TensorOptions options) {
  TORCH_CHECK_VALUE(options.device().type() == c10::DeviceType::PrivateUse1,
                    "hccl: allocateTensor serves npu tensors (the memory its engine maps across ranks); got device ",
                    options.device(), ". Allocate host buffers with torch.empty");
  TORCH_CHECK_VALUE(size >= 0, "hccl: allocateTensor: size must be >= 0, got ", size);
  return at::empty({size}, options);
}

bool ProcessGroupHCCL::supportsTensorAlloc(c10::DeviceIndex device_index) {
  // torch passes only the index: an npu device's (>= 0); a cpu device has none (-1).
  return device_index >= 0;
}

}  // namespace npudist::hccl
