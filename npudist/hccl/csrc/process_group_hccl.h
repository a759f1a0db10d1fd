// ProcessGroupHCCL: the c10d::Backend behind `init_process_group("hccl")`.
//
// Every op goes through the group's Communicator (the seam, include/npudist/communicator.h), which
// make_communicator (communicator_factory.h) chooses once at construction from the topology: shared
// memory when the group lives on one node, hierarchical (shm inside nodes, Gloo between them) otherwise,
// Gloo alone when NPUDIST_HCCL_COMMUNICATOR=gloo.
// Execution: small synchronous ops run on the calling thread; asynchronous ones on a per-group worker
// lane (p2p: one lane per peer and direction). npu tensors are protected with record_stream on the
// group's comm stream, which carries a fence that completes with the op.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "npudist/communicator.h"
#include "flight_recorder.h"
#include "lane.h"
#include "topology.h"

namespace npudist::hccl {

// Backend options: `hccl_config` keys are validated by the Python binding.
struct HCCLOptions : c10d::Backend::Options {
  explicit HCCLOptions(std::chrono::milliseconds timeout = kBackendDefaultTimeout)
      : Options("hccl", timeout) {}
  size_t buffer_bytes = 0;                            // hccl_buffer_size; 0: HCCL_BUFFSIZE (MB, default 200)
  std::chrono::milliseconds connect_timeout{0};       // 0: HCCL_CONNECT_TIMEOUT (s) or 120 s
  std::chrono::milliseconds exec_timeout{0};          // hccl_exec_timeout; 0: HCCL_EXEC_TIMEOUT rules
  bool timeout_from_user = true;                      // false: HCCL_EXEC_TIMEOUT may override
};

class WorkHCCL;

// One op as the adapter sees it: what to run plus what to report.
struct OpSpec {
  c10d::OpType type = c10d::OpType::UNKNOWN;
  const char* name = "";
  std::vector<at::Tensor> inputs, outputs;  // kept alive until completion; outputs go to the future
  std::string dtype, reduce_op;
  int root = -1;
  bool async = true;
  bool p2p = false;
  bool is_send = false;
  int peer = -1;
  std::function<void(uint64_t seq)> body;  // runs the op (throws on failure)
  std::shared_ptr<std::atomic<int>> source;  // any-source recv: the sender's group rank, once known
};

class ProcessGroupHCCL : public c10d::Backend {
 public:
  ProcessGroupHCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   c10::intrusive_ptr<HCCLOptions> options);
  ~ProcessGroupHCCL() override;

  const std::string getBackendName() const override { return "hccl"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  bool supportsSplitting() const override { return true; }
  // capabilities.cpp: coalescing (ops between start and end complete as one Work), shrinking (a new group of
  // the remaining ranks), tensors allocated for communication (npu memory, which the engine maps zero-copy).
  bool supportsCoalescing() const override { return true; }
  bool supportsShrinking() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<c10d::Backend::Options>& opts_override) override;
  at::Tensor allocateTensor(long size, at::TensorOptions options) override;
  bool supportsTensorAlloc(c10::DeviceIndex device_index) override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  // init_process_group(device_id=...): the communicator's device buffers are charged there now, as NCCL and
  // HCCL create the communicator eagerly (device_buffers.cpp).
  void eagerConnectSingleDevice(at::Device device) override;
  void setSequenceNumberForGroup() override { seq_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void setGroupUid(const std::string& pg_uid) override;
  c10d::ErrorType getError() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // point_to_point.cpp: a peek at each peer's next message, then an ordinary receive.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  // barriers.cpp: through the group's store, so rank 0 can name every rank that did not arrive.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;

  // Fails pending and future ops with an error naming `reason`; safe from any thread.
  void abort() override;
  // Drains pending ops (bounded by the timeout), then releases the communicator.
  void shutdown() override;
  // reinit.cpp: torch_npu's abort_hccl_comm(reason) (reinit_process_group): aborts the communicator (pending ops
  // fail naming `reason`), drains them and drops it; the group's next op builds a new one with every rank that
  // did the same (a new generation of store keys). A group already waiting for its rebuild is left as it is.
  void abort_and_clear_comm(const std::string& reason);
  // How many communicators reinit replaced (0: the one built with the group).
  uint64_t generation() const { return generation_.load(); }

  // Introspection for Python/tests.
  const Topology& topology() const { return topo_; }
  std::string comm_name() const { return comm_name_; }
  // Collectives of the intra-node communicator that ran zero-copy (npu tensors in shareable memory).
  uint64_t zero_copy_ops() const { return comm_ ? comm_->zero_copy_ops() : 0; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // CANN's HCCL_BUFFSIZE for this communicator (hccl_config['hccl_buffer_size'] or HCCL_BUFFSIZE, MB -> bytes).
  size_t buffer_bytes() const { return hccl_buffer_bytes_; }
  // The shared-memory engine's real per-rank staging buffer: min(buffer_bytes, the engine's 8 MB).
  size_t staging_bytes() const { return buffer_bytes_; }
  // Device memory the communicator holds on each npu device it used: 2 x buffer_bytes (docs/hccl.md).
  size_t device_buffer_bytes() const { return 2 * hccl_buffer_bytes_; }
  // npu devices whose buffers are charged now.
  std::vector<int> charged_devices();
  // HCCL_DETERMINISTIC as read at construction ("false", "true" or "strict").
  const std::string& deterministic() const { return deterministic_; }
  // "shm", "gloo" or "hierarchical": the group's Communicator.
  std::string communicator_kind() const { return comm_ ? comm_->kind() : "none"; }

  // Called by WorkHCCL when its op finishes.
  void on_work_done(WorkHCCL* w);

 private:
  friend class WorkHCCL;
  // Builds the communicator: at construction (generation 0, HCCL_CONNECT_TIMEOUT) and, after
  // abort_and_clear_comm, in the group's next op (reconnect, under issue_mu_; the group's timeout).
  void connect();
  void reconnect(const char* op);
  c10::intrusive_ptr<c10d::Work> issue(OpSpec spec);
  // The result of a synchronous collective once it completed: no Work (NCCL's), or its failure raised.
  c10::intrusive_ptr<c10d::Work> finish_synchronous(const c10::intrusive_ptr<WorkHCCL>& work);
  // `started_at_issue`: issue() already recorded the op as started (it runs right away on the caller's thread).
  void execute(const c10::intrusive_ptr<WorkHCCL>& work, bool started_at_issue = false);
  std::exception_ptr translate_error(const std::exception& e, const WorkHCCL& w, bool comm_error);
  void check_usable(const char* op);
  void check_tensor(const at::Tensor& t, const char* op, const char* what);
  void check_rank(int r, const char* op, const char* what);
  Lane& p2p_lane(int peer, bool is_send);
  void start_watchdog();
  void watchdog_loop();
  // device_buffers.cpp: the charge of 2 x HCCL_BUFFSIZE on an npu device, made when the group first moves
  // npu tensors of that device (or eagerly); torch.OutOfMemoryError when the device has no room for it.
  void charge_device_buffers(int device);
  void release_device_buffers();
  // connect(): the EI0006 error of a communicator whose peers did not all join in time.
  [[noreturn]] void throw_connect_timeout(const std::vector<int>& missing, const std::string& detail);
  // The op timeout and what set it, for EI0002 messages ("HCCL_EXEC_TIMEOUT", ...).
  std::string timeout_source_;

  // The ops as Communicator calls (communicator_calls.cpp): reduce-op mapping, counts, the ordering stream.
  comm::Stream stream_of(const at::Tensor& t);
  void do_all_reduce(at::Tensor& t, const c10d::ReduceOp& op, uint64_t seq, const char* name);
  void do_broadcast(at::Tensor& t, int root, uint64_t seq, const char* name);
  void do_reduce(at::Tensor& t, const c10d::ReduceOp& op, int root, uint64_t seq);
  void do_all_gather(const at::Tensor& in, at::Tensor& out, uint64_t seq, const char* name);
  void do_reduce_scatter(const at::Tensor& in, at::Tensor& out, const c10d::ReduceOp& op,
                         uint64_t seq, const char* name);
  void do_all_to_all(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& send_elems,
                     const std::vector<int64_t>& recv_elems, uint64_t seq, const char* name);
  void do_gather(const at::Tensor& in, at::Tensor* out, int root, uint64_t seq);
  void do_scatter(const at::Tensor* in, at::Tensor& out, int root, uint64_t seq);
  void do_barrier(uint64_t seq);
  void do_send(const at::Tensor& t, int peer, int tag);
  void do_recv(at::Tensor& t, int peer, int tag);
  // send/recv between a rank and itself (point_to_point.cpp): a send leaves a copy in a mailbox, a recv takes the
  // oldest one (matched in order, like messages between two ranks); no communicator involved.
  void send_to_self(const at::Tensor& t, int tag);
  void recv_from_self(at::Tensor& t, int tag);
  // sparse_all_reduce.cpp
  c10::intrusive_ptr<c10d::Work> allreduce_sparse_coo(const at::Tensor& t, const c10d::AllreduceOptions& opts);
  // point_to_point.cpp
  int recv_any(at::Tensor& t, int tag);  // returns the sender's group rank
  // barriers.cpp: numbers each monitoredBarrier's store keys
  std::atomic<uint64_t> monitored_seq_{0};

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<HCCLOptions> options_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds connect_timeout_;
  size_t buffer_bytes_ = 0;       // engine staging buffer
  size_t hccl_buffer_bytes_ = 0;  // HCCL_BUFFSIZE / hccl_buffer_size
  std::string buffer_source_;     // which of the two set it, for messages
  std::mutex charge_mu_;
  std::atomic<uint64_t> charged_mask_{0};             // bit d: device d charged (fast path of issue)
  std::vector<std::pair<int, uint64_t>> charges_;     // (device, runtime handle), under charge_mu_
  Topology topo_;
  std::string comm_name_;
  std::unique_ptr<comm::Communicator> comm_;  // null once shut down, and after reinit until the next op
  // reinit (reinit.cpp): comm_ is replaced under comm_mu_, which the watchdog and abort() hold to use it.
  std::mutex comm_mu_;
  std::string ns_base_;                         // "hccl<k>/": this construction's keys on the store
  std::atomic<uint64_t> generation_{0};         // communicators replaced so far; names the keys of the next
  std::atomic<bool> needs_connect_{false};      // cleared by reinit: the next op builds the communicator
  const char* rebuild_op_ = nullptr;            // the op rebuilding it, for connect errors

  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> p2p_seq_{0};
  std::mutex issue_mu_;  // issue order == sequence order
  // Coalescing (guarded by issue_mu_): the Works issued since startCoalescing, for endCoalescing.
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  uint64_t shrinks_ = 0;  // shrink() calls so far: names the store prefix of each shrunk group
  Lane coll_lane_;
  std::mutex p2p_mu_;
  std::map<std::pair<int, bool>, std::unique_ptr<Lane>> p2p_lanes_;
  struct SelfMessage {
    int tag;
    at::Tensor data;
  };
  std::mutex self_mu_;
  std::condition_variable self_cv_;
  std::deque<SelfMessage> self_box_;

  // npu: one comm stream per device, created on first use.
  std::mutex stream_mu_;
  std::map<int, int64_t> comm_streams_;
  int64_t comm_stream(int device);

  uint64_t trace_pg_id_ = 0;  // this group in the process's FlightRecorder

  // Outstanding work, observed by the watchdog.
  std::mutex works_mu_;
  std::list<c10::intrusive_ptr<WorkHCCL>> outstanding_;
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;
  bool watchdog_stop_ = false;

  // torch's splitGroup calls split() once per device type the backend serves (cpu and npu): the same
  // child is returned for the same new group name, so one communicator backs both.
  std::mutex split_mu_;
  std::string last_split_name_;
  c10::weak_intrusive_ptr<c10d::Backend> last_split_{c10::intrusive_ptr<c10d::Backend>()};

  // TORCH_HCCL_ENABLE_MONITORING: a thread that ends the process when the watchdog stops beating for
  // TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC (the watchdog itself stuck, e.g. writing a dump to a hung file system).
  bool monitoring_ = false;
  std::chrono::seconds heartbeat_timeout_{600};
  std::atomic<uint64_t> heartbeat_{0};
  std::thread monitor_;
  void monitor_loop();
  std::string deterministic_;

  std::atomic<bool> aborted_{false};
  std::atomic<bool> terminated_{false};  // shut down or destroyed
  std::string abort_reason_;
  std::atomic<int> error_type_{0};
  int async_error_handling_ = 1;
  bool blocking_wait_ = false;
  bool dump_on_timeout_ = false;
  std::atomic<bool> dumped_{false};  // this group already wrote its flight-recorder dump
  void dump_now(const std::string& reason);
  int global_rank_ = 0;
};

// The Work returned by every op.
class WorkHCCL : public c10d::Work {
 public:
  // device: the npu device of the op's tensors, -1 for cpu tensors (the future's devices).
  WorkHCCL(ProcessGroupHCCL* pg, OpSpec spec, uint64_t seq, uint64_t trace_id, int device,
           std::chrono::steady_clock::time_point issued);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;        // execution.cpp
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override;
  std::vector<at::Tensor> result() override { return spec_.outputs; }
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override;  // point_to_point.cpp
  float getDuration() const override;

  // Blocks until completed without raising (used by the npu stream fence).
  void block_until_done();
  // Completes the work (once); called by the executing thread.
  void complete(std::exception_ptr error);
  // npu tensors, asynchronous path: completes the future when the op is issued, its value ordered on the comm
  // stream (events recorded there after the op's fence), as NCCL's future completes when its op is enqueued.
  void complete_future_at_issue(const c10::Stream& comm_stream);
  std::string describe() const;
  // exception() without the lock, for a thread that saw the op complete (ran it, or waited for it).
  const std::exception_ptr& outcome() const { return exception_; }

  OpSpec spec_;
  const uint64_t seq_;
  const uint64_t trace_id_;
  std::chrono::steady_clock::time_point issued_, started_, finished_;
  std::atomic<bool> observed_{false};     // the user saw the outcome (wait/future)
  std::atomic<bool> error_handled_{false};  // the watchdog acted on its failure
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // an op run when issued: made on first request
  // Futures: cpu tensors' complete with the op, on a callback thread (callback_pool.h) or on a thread that
  // wait()s for the op, whichever claims it first; never on the thread that ran the op, where a then()
  // callback that waits for another op of the group would deadlock it. An op run when issued, on the caller's
  // thread gets its future on the first request, made completed (settled_future).
  std::atomic<bool> future_claimed_{false};
  std::atomic<bool> future_taken_{false};  // getFuture() was called (DDP hooks): failures must surface
  bool future_inline_ = false;             // the op runs when issued, on the caller's thread
  ProcessGroupHCCL* pg_;  // valid while the work is outstanding (the group drains before dying)
  Lane* lane_ = nullptr;  // the collective lane it was queued on (wait() may run it there and then)
  uint64_t ticket_ = 0;
  int device_ = -1;  // the npu device of its tensors, -1 for cpu tensors
  uint64_t generation_ = 0;  // the group's communicator generation it was issued on (reinit.cpp)
  const bool profiling_event_;  // c10d::Work opened a profiler event for it (close_profiling_event ends it)

 private:
  // wait() without blocking the host: order the caller's current npu stream after this op.
  bool wait_on_stream();
  void close_profiling_event();
  // Completes the future with the op's outcome if nobody has yet; returns false if another thread claimed it.
  bool finish_future();
  c10::intrusive_ptr<c10::ivalue::Future> settled_future();
};

// Mapping helpers shared by the translation units.
// The seam's element type of a tensor dtype; a dtype hccl cannot move is a ValueError naming `op`.
comm::ElementType element_type_of(at::ScalarType t, const char* op);

}  // namespace npudist::hccl
