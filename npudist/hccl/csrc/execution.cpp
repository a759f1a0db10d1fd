// ProcessGroupHCCL: issuing an op and executing it (caller thread or worker lanes; npu stream gate and fence),
// error translation, and WorkHCCL.
#include <ATen/record_function.h>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "callback_pool.h"
#include "flight_recorder_dump.h"
#include "internal.h"
#include "process_group_hccl.h"
#include "profiling.h"

namespace npudist::hccl {

// ------------------------------------------------------------------------------------------------
// Issue / execution

void ProcessGroupHCCL::check_usable(const char* op) {
  if (terminated_) {
    TORCH_CHECK(false, "hccl: ", op, " called on group '", options_->group_name,
                "' after it was shut down or destroyed; create a new group");
  }
  if (aborted_) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: ", op, " called on group '", options_->group_name,
                             "' after it was aborted (", abort_reason_,
                             "); destroy it and create a new group, or call "
                             "torch_npu.distributed.reinit_process_group(group) on every rank to rebuild its "
                             "communicator"));
  }
}

int64_t ProcessGroupHCCL::comm_stream(int device) {
  std::lock_guard<std::mutex> g(stream_mu_);
  auto it = comm_streams_.find(device);
  if (it != comm_streams_.end()) return it->second;
  auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
  c10::Device dev(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  c10::Stream s = impl->getStreamFromGlobalPool(dev, false);
  try {
    s = impl->getNewStream(dev, 0);
  } catch (const c10::Error&) {
    // The pool stream serves as well; a dedicated one only avoids sharing a queue with others.
  }
  comm_streams_[device] = s.id();
  return s.id();
}

namespace {

// Set by a host function on the caller's current npu stream once all work queued before it has run.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  static void open_fn(void* arg) {
    auto* g = static_cast<std::shared_ptr<Gate>*>(arg);
    {
      std::lock_guard<std::mutex> l((*g)->mu);
      (*g)->open = true;
    }
    (*g)->cv.notify_all();
    delete g;
  }
};

// Hands a collective's failure to the launch table, which raises it at the next synchronization point.
void record_async_failure(const std::exception_ptr& err, const char* how) {
  std::string msg;
  try {
    std::rethrow_exception(err);
  } catch (const std::exception& e) {
    msg = e.what();
  }
  launch_api()->record_async_error(c10::str(msg, "\n(", how, ")").c_str());
}

// Runs on the group's comm stream and returns once the op has completed, so the allocator (which
// tracks the comm stream through record_stream) reuses the op's memory only afterwards, and work ordered
// after the op's future (recorded on this stream right after the fence) sees its result. A failure whose
// future was handed out and that no wait() reported is raised at the next synchronization point: the
// future completed when the op was issued and cannot carry it.
struct Fence {
  c10::intrusive_ptr<WorkHCCL> work;
  static void wait_fn(void* arg) {
    std::unique_ptr<Fence> f(static_cast<Fence*>(arg));
    f->work->block_until_done();
    if (f->work->future_taken_ && !f->work->observed_) {
      if (auto err = f->work->exception()) {
        record_async_failure(err, "the Work's future on npu tensors completes when the op is issued, ordered on "
                                  "the npu stream; its failure surfaces at the next synchronization");
      }
    }
  }
};

// NCCL's future type: the op's tensors, on the op's device (none for cpu tensors).
c10::intrusive_ptr<c10::ivalue::Future> make_future(int device) {
  std::vector<c10::Device> devices;
  if (device >= 0) devices.emplace_back(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(), std::move(devices));
}

int npu_device_of(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (const auto* v : {&a, &b}) {
    for (const auto& t : *v) {
      if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) return t.device().index();
    }
  }
  return -1;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::issue(OpSpec spec) {
  check_usable(spec.name);
  const NpudistRuntimeApi* api = runtime_api();
  const int device = npu_device_of(spec.inputs, spec.outputs);
  if (device >= 0) {
    TORCH_CHECK(api != nullptr,
                "hccl: npu tensors need the device runtime; `import npudist` before using them");
    // The communicator's buffers on this device (device_buffers.cpp), before the op takes a sequence number.
    if (!(charged_mask_.load(std::memory_order_relaxed) & (uint64_t{1} << device))) charge_device_buffers(device);
  }
  std::lock_guard<std::mutex> issuing(issue_mu_);
  if (needs_connect_) reconnect(spec.name);  // the first op after reinit builds the communicator (reinit.cpp)
  const uint64_t seq = spec.p2p ? ++p2p_seq_ : ++seq_;
  int64_t cur_stream = 0;
  if (device >= 0) {
    cur_stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
                     ->getStream(c10::Device(c10::DeviceType::PrivateUse1,
                                             static_cast<c10::DeviceIndex>(device)))
                     .id();
  }
  const bool stream_busy = device >= 0 && api->stream_query(device, cur_stream) == 0;
  // A synchronous op runs on the caller's thread when nothing is queued before it on the collective lane.
  const bool run_now = !spec.async && !spec.p2p && coll_lane_.idle();
  // Nothing to wait for before it runs: it starts as it is recorded (its start time is its issue time).
  const bool starts_now = run_now && !stream_busy;
  // One clock read for the op's issue time: the Work's, and the flight recorder's creation time.
  const auto issued = std::chrono::steady_clock::now();
  const uint64_t trace_id = record_op(trace_pg_id_, options_->group_name,
                                      getGroupDesc().empty() ? options_->group_desc : getGroupDesc(), spec, seq_,
                                      p2p_seq_, timeout_.count(), steady_ns(issued), starts_now);
  auto work = c10::make_intrusive<WorkHCCL>(this, std::move(spec), seq, trace_id, device, issued);
  work->generation_ = generation_.load();
  const auto& s = work->spec_;
  if (coalescing_) coalesced_.push_back(work);

  if (run_now) {
    // Synchronous op on the caller's thread: ordered after the current stream by draining it.
    if (stream_busy) api->stream_synchronize(device, cur_stream);
    work->observed_ = true;  // its failure raises from this call (finish_synchronous)
    work->future_inline_ = true;
    profiling::note_issue(*work, device, cur_stream);
    if (starts_now) work->started_ = work->issued_;
    execute(work, starts_now);
    return finish_synchronous(work);
  }

  work->future_ = make_future(device);  // before any other thread sees the Work
  std::shared_ptr<Gate> gate;
  if (stream_busy) {
    gate = std::make_shared<Gate>();
    api->launch_host_func(device, cur_stream, &Gate::open_fn, new std::shared_ptr<Gate>(gate));
  }
  if (device >= 0) {
    const int64_t cs = comm_stream(device);
    c10::Stream stream(c10::Stream::UNSAFE,
                       c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)),
                       cs);
    for (const auto* v : {&s.inputs, &s.outputs}) {
      for (const auto& t : *v) {
        if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 && t.has_storage()) {
          t.record_stream(stream);
        }
      }
    }
    api->launch_host_func(device, cs, &Fence::wait_fn, new Fence{work});
    work->complete_future_at_issue(stream);
    profiling::note_issue(*work, device, cs);
  }
  {
    std::lock_guard<std::mutex> g(works_mu_);
    outstanding_.push_back(work);
  }
  auto task = [this, work, gate]() {
    if (gate) {
      std::unique_lock<std::mutex> l(gate->mu);
      if (!gate->cv.wait_for(l, timeout_, [&] { return gate->open; })) {
        work->complete(std::make_exception_ptr(c10::DistBackendError(
            HCCL_HERE, c10::str("hccl: ", work->describe(),
                                     " gave up waiting for the npu stream it was issued on (",
                                     timeout_.count(), " ms)"))));
        return;
      }
    }
    execute(work);
  };
  if (s.p2p) {
    p2p_lane(s.peer, s.is_send).submit(std::move(task));
  } else {
    work->lane_ = &coll_lane_;
    work->ticket_ = coll_lane_.submit(std::move(task));
  }
  if (!s.async && !s.p2p) {
    work->wait(kNoTimeout);  // queued behind earlier ops or the npu stream: as c10d's wait() would right away
    return finish_synchronous(work);
  }
  return work;
}

// As ProcessGroupNCCL since torch 2.8: a synchronous collective (c10d's asyncOp=False, what
// dist.all_reduce(async_op=False) and its siblings pass) returns no Work; torch's Python API then skips
// wait() ("the backend has sync'ed at CPP level"). The op has completed here and its failure is raised here.
// No Python Work object is made, waited on and freed per call, and the Work's references to the caller's
// tensors are dropped while their pybind caster still holds them: freeing them later, in the Python
// Work's deallocation, took the GIL once more per call (the last C++ reference to a tensor with a
// PyObject releases that object). Point-to-point ops are always asynchronous in c10d and keep their Work.
// Both paths have marked the Work observed: the run-now one before executing it, wait() when it starts.
c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::finish_synchronous(const c10::intrusive_ptr<WorkHCCL>& work) {
  // Read without the Work's lock: it completed on this thread, or wait() saw it complete under the lock.
  if (work->outcome()) std::rethrow_exception(work->outcome());
  return {};
}

Lane& ProcessGroupHCCL::p2p_lane(int peer, bool is_send) {
  std::lock_guard<std::mutex> g(p2p_mu_);
  auto& lane = p2p_lanes_[{peer, is_send}];
  if (!lane) lane = std::make_unique<Lane>((is_send ? "hccl_send" : "hccl_recv") + std::to_string(peer));
  return *lane;
}

void ProcessGroupHCCL::execute(const c10::intrusive_ptr<WorkHCCL>& work, bool started_at_issue) {
  profiling::CollectiveScope collective_event(*work);
  if (!started_at_issue) {
    work->started_ = std::chrono::steady_clock::now();
    FlightRecorder::get().mark_started(work->trace_id_, trace_pg_id_, work->spec_.p2p ? 0 : work->seq_,
                                       steady_ns(work->started_));
  }
  std::exception_ptr err;
  try {
    if (aborted_) {
      throw comm::CommError(comm::FailureKind::kAborted, "group was aborted: " + abort_reason_);
    }
    // The body's aten ops on npu tensors touch bytes it also reads through data_ptr(): they run inline. An op
    // on cpu tensors only launches nothing on an npu stream.
    std::optional<InlineLaunchScope> inline_ops;
    if (work->device_ >= 0) inline_ops.emplace();
    work->spec_.body(work->seq_);
  } catch (const comm::CommError& e) {
    err = translate_error(e, *work, true);
  } catch (const c10::ValueError& e) {
    err = std::current_exception();
  } catch (const c10::DistBackendError& e) {
    err = std::current_exception();
  } catch (const std::exception& e) {
    err = translate_error(e, *work, false);
  }
  work->complete(err);
}

std::exception_ptr ProcessGroupHCCL::translate_error(const std::exception& e, const WorkHCCL& w,
                                                     bool comm_error) {
  std::string kind = "failed";
  if (comm_error) {
    const auto& ee = static_cast<const comm::CommError&>(e);
    switch (ee.kind) {
      case comm::FailureKind::kTimeout: {
        // EI0002 is CANN's code for a collective whose notify wait expired (HCCL_EXEC_TIMEOUT): the code
        // Ascend users search their logs for, with CANN's reading of it.
        std::string remote;
        for (int r : ee.ranks) remote += (remote.empty() ? "" : ", ") + std::to_string(r);
        kind = c10::str("timed out (group timeout of ", timeout_.count(), " ms): EI0002: the notify wait timed out "
                        "after ", timeout_.count() / 1000.0, " s (", timeout_source_,
                        "): no notify record from remote rank [", remote.empty() ? std::string("?") : remote,
                        "]. The remote rank skipped or reordered this collective, is stuck or much slower, or "
                        "exited; check its own error first (the flight recorder, TORCH_HCCL_DUMP_ON_TIMEOUT=1, "
                        "shows what each rank issued), or raise ", timeout_source_ == "HCCL_EXEC_TIMEOUT" ||
                        timeout_source_ == "the default group timeout" ? std::string("HCCL_EXEC_TIMEOUT")
                        : timeout_source_, " if the ranks are only far apart. The engine says");
        error_type_ = static_cast<int>(c10d::ErrorType::TIMEOUT);
        break;
      }
      case comm::FailureKind::kPeerDied: kind = "failed: a peer process died"; break;
      case comm::FailureKind::kMismatch: kind = "failed: ranks called mismatched collectives"; break;
      case comm::FailureKind::kAborted: kind = "was aborted"; break;
      case comm::FailureKind::kInvalidArgument:
        return std::make_exception_ptr(c10::ValueError(
            HCCL_HERE, c10::str("hccl: ", w.describe(), ": ", e.what())));
      case comm::FailureKind::kSystem: kind = "failed: system error"; break;
    }
    if (ee.kind != comm::FailureKind::kTimeout) error_type_ = static_cast<int>(c10d::ErrorType::COMM_ERROR);
  } else {
    error_type_ = static_cast<int>(c10d::ErrorType::COMM_ERROR);
  }
  return std::make_exception_ptr(c10::DistBackendError(
      HCCL_HERE, c10::str("hccl: ", w.describe(), " ", kind, ": ", e.what())));
}

// ------------------------------------------------------------------------------------------------
// Work

namespace {

// Whether a RecordFunction callback (torch.profiler's) records now: the thread's cached set of callbacks,
// without the lock at::hasCallbacks() takes on the global ones (two per op, 0.05 us).
bool records_events() { return at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE).has_value(); }

// The op's CPU event for torch.profiler, "hccl:<op>" (Gloo's and NCCL's pattern, the names PyTorch's
// DistributedTest looks up), or null when nothing records. c10d::Work opens it as an async event with the
// shapes of profiled_inputs; complete() closes it. Interned: the profiler may keep the pointer past the op.
const char* profiling_title(const OpSpec& spec) {
  if (!records_events()) return nullptr;
  static std::mutex m;
  static std::unordered_map<std::string, std::string> titles;
  std::string name = spec.name;
  switch (spec.type) {  // Gloo's names for the forms hccl names apart
    case c10d::OpType::ALLREDUCE_COALESCED: name = "all_reduce"; break;
    case c10d::OpType::ALLGATHER_COALESCED: name = "all_gather"; break;
    case c10d::OpType::RECVANYSOURCE: name = "recvAnySource"; break;
    default: break;
  }
  std::lock_guard<std::mutex> g(m);
  auto it = titles.try_emplace(name, "hccl:" + name).first;
  return it->second.c_str();
}

// A receive has no input: its event shows the buffer it fills, as Gloo's and NCCL's do. Without callbacks
// there is no event (profiling_title is null) and c10d::Work ignores the shapes: no copy of the tensor list.
std::optional<std::vector<at::Tensor>> profiled_inputs(const OpSpec& spec) {
  if (!records_events()) return std::nullopt;
  return spec.inputs.empty() ? spec.outputs : spec.inputs;
}

}  // namespace

WorkHCCL::WorkHCCL(ProcessGroupHCCL* pg, OpSpec spec, uint64_t seq, uint64_t trace_id, int device,
                   std::chrono::steady_clock::time_point issued)
    : c10d::Work(pg->getRank(), spec.type, profiling_title(spec), profiled_inputs(spec)),
      spec_(std::move(spec)),
      seq_(seq),
      trace_id_(trace_id),
      issued_(issued),
      pg_(pg),
      device_(device),
      profiling_event_(static_cast<bool>(recordFunctionEndCallback_)) {}

std::string WorkHCCL::describe() const {
  return c10::str(spec_.name, spec_.p2p ? c10::str(" (p2p seq ", seq_, ", peer ", spec_.peer, ")")
                                        : c10::str(" (seq ", seq_, ")"),
                  " on group '", pg_->options_->group_name, "'",
                  pg_->getGroupDesc().empty() ? std::string() : " (" + pg_->getGroupDesc() + ")",
                  " (rank ", pg_->getRank(), " of ", pg_->getSize(), ")");
}

bool WorkHCCL::isCompleted() {
  std::lock_guard<std::mutex> g(mutex_);
  return completed_;
}

bool WorkHCCL::isSuccess() const {
  std::lock_guard<std::mutex> g(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr WorkHCCL::exception() const {
  std::lock_guard<std::mutex> g(mutex_);
  return exception_;
}

namespace {

void record_wait_failure(const std::exception_ptr& err) {
  record_async_failure(err, "Work.wait() on npu tensors orders the current npu stream after the collective and "
                            "returns; set TORCH_HCCL_BLOCKING_WAIT=1 to raise in wait()");
}

// Queued on the waiting thread's current npu stream by a non-blocking wait(): holds the stream until the op
// completed, and hands a failure to the launch table.
struct StreamWait {
  c10::intrusive_ptr<WorkHCCL> work;
  static void run_fn(void* arg) {
    std::unique_ptr<StreamWait> w(static_cast<StreamWait*>(arg));
    w->work->block_until_done();
    if (auto err = w->work->exception()) record_wait_failure(err);
  }
};

}  // namespace

// As NCCL's Work.wait(): for an asynchronous op on npu tensors under asynchronous launch, work queued on the
// caller's current stream after wait() runs after the op, and the host goes on. A synchronous op
// (async_op=False), TORCH_HCCL_BLOCKING_WAIT=1, a wait with its own timeout, blocking launch, cpu tensors and
// a receive from any source keep the blocking wait. An op that already completed needs no stream order; if it
// failed, its error still goes to the next synchronization point, so whether wait() raises does not depend on
// how fast the failure was detected.
bool WorkHCCL::wait_on_stream() {
  const NpudistLaunchApi* launch = launch_api();
  const NpudistRuntimeApi* api = runtime_api();
  if (device_ < 0 || !spec_.async || pg_->blocking_wait_ || !launch || !api || !launch->launches_async()) {
    return false;
  }
  // A receive from any source: dist.recv() asks for the sender's rank right after wait(), on the host.
  if (spec_.source) return false;
  if (isCompleted()) {
    auto err = exception();
    if (!err) return false;
    record_wait_failure(err);
    close_profiling_event();
    return true;
  }
  const int64_t stream = api->get_stream(device_);
  auto* arg = new StreamWait{c10::intrusive_ptr<WorkHCCL>::reclaim_copy(this)};
  if (api->launch_host_func(device_, stream, &StreamWait::run_fn, arg) != NPUDIST_SUCCESS) {
    delete arg;
    return false;  // the stream refused the task (e.g. it is being captured): wait on the host instead
  }
  close_profiling_event();
  return true;
}

// Ends the op's "hccl:<op>" CPU event, once: when the op completes, or earlier when wait() hands it to the
// npu stream and returns, so the event never outlives the host's wait (torch.profiler builds its event
// tree when the profile ends and crashes on an event still open; the npu-side event covers the rest).
void WorkHCCL::close_profiling_event() {
  if (!profiling_event_) return;
  std::function<void()> end;
  {
    std::lock_guard<std::mutex> g(mutex_);
    end.swap(recordFunctionEndCallback_);
  }
  if (end) end();
}

bool WorkHCCL::wait(std::chrono::milliseconds timeout) {
  observed_ = true;
  if (timeout == kNoTimeout && wait_on_stream()) return true;
  // Not started yet: run it (and anything queued before it) here instead of waking the lane thread. Not
  // under a wait timeout: the op would block this thread for the group's timeout instead of the wait's.
  if (timeout == kNoTimeout && lane_ && !isCompleted()) lane_->run_here(ticket_);
  std::unique_lock<std::mutex> lk(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lk, [&] { return completed_; });
  } else if (!cv_.wait_for(lk, timeout, [&] { return completed_; })) {
    // "caught collective operation timeout": NCCL's and torch_npu's words, which tools and tests match.
    C10_THROW_ERROR(DistBackendError,
                    c10::str("hccl: ", describe(), " caught collective operation timeout: it did not complete "
                             "within the wait timeout of ",
                             timeout.count(), " ms"));
  }
  auto err = exception_;
  lk.unlock();
  // DDP reads getFuture()->value() right after wait(): the future must be complete when wait() returns.
  if (!future_inline_ && !finish_future() && !future_->completed()) future_->wait();
  if (err) std::rethrow_exception(err);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkHCCL::getFuture() {
  future_taken_ = true;
  return settled_future();
}

c10::intrusive_ptr<c10::ivalue::Future> WorkHCCL::getFutureResult() { return settled_future(); }

// An op run when issued (synchronous, on the caller's thread) gets its future only when someone asks for it:
// its Work reaches a caller only inside a coalesced group's (finish_synchronous returns none), and making the
// future and marking it completed cost ~0.15 µs per call on cpu tensors, ~0.45 µs on npu tensors (an event per
// device; docs/hccl_engine.md, "Small-message latency"). The future is made completed, so no callback can ever run
// on the thread that ran the op; on npu tensors its event is recorded on the device's current stream at the
// request, which the op precedes (it ran on the host before returning).
c10::intrusive_ptr<c10::ivalue::Future> WorkHCCL::settled_future() {
  if (!future_inline_) return future_;
  static std::mutex m;  // requests from several threads for one Work (rare: the path is cold)
  std::lock_guard<std::mutex> g(m);
  if (!future_) {
    future_ = make_future(device_);
    finish_future();
  }
  return future_;
}

bool WorkHCCL::finish_future() {
  if (future_claimed_.exchange(true)) return false;
  std::exception_ptr err = exception();
  if (err) {
    future_->setError(err);
  } else {
    future_->markCompleted(c10::IValue(spec_.outputs));
  }
  return true;
}

void WorkHCCL::complete_future_at_issue(const c10::Stream& comm_stream) {
  future_claimed_ = true;
  // The storages of inputs and outputs: a consumer of the future (a send's included) is ordered after the
  // whole op, and the comm stream's fence keeps the memory until then.
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> storages;
  for (const auto* v : {&spec_.inputs, &spec_.outputs}) {
    for (const auto& t : *v) {
      if (t.defined() && t.has_storage() && t.device().type() == c10::DeviceType::PrivateUse1) {
        storages.push_back(t.storage().getWeakStorageImpl());
      }
    }
  }
  c10::StreamGuard on_comm_stream(comm_stream);  // markCompleted records its events on the current stream
  future_->markCompleted(c10::IValue(spec_.outputs), std::move(storages));
}

void WorkHCCL::synchronize() { wait(kNoTimeout); }

void WorkHCCL::block_until_done() {
  std::unique_lock<std::mutex> lk(mutex_);
  cv_.wait(lk, [&] { return completed_; });
}

void WorkHCCL::abort() { pg_->abort(); }

float WorkHCCL::getDuration() const {
  std::lock_guard<std::mutex> g(mutex_);
  TORCH_CHECK(completed_, "hccl: getDuration() of an op that has not completed");
  return std::chrono::duration<float, std::milli>(finished_ - started_).count();
}

void WorkHCCL::complete(std::exception_ptr error) {
  // The profiler event ends before any waiter wakes: a waiter may stop the profiler as soon as wait()
  // returns, and an event ended on this thread while the profiler collects its results corrupted them
  // (torch.profiler's parse failed with "std::get: wrong index for variant").
  close_profiling_event();
  const auto set_outcome = [&] {
    finished_ = std::chrono::steady_clock::now();
    if (started_.time_since_epoch().count() == 0) started_ = finished_;
    completed_ = true;
    exception_ = error;
  };
  if (future_inline_) {
    // An op run when issued, on this thread, completes once and before any other thread can see its Work:
    // a synchronous op returns none (finish_synchronous), and the coalesced group's Work that lists it is
    // handed out later. No lock, nobody to notify.
    set_outcome();
  } else {
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (completed_) return;
      set_outcome();
    }
    cv_.notify_all();
  }
  std::string msg;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      msg = e.what();
    }
  }
  if (!future_inline_ && !future_claimed_) {  // an op run when issued makes its future on request
    post_completion([w = c10::intrusive_ptr<WorkHCCL>::reclaim_copy(this)] { w->finish_future(); });
  }
  FlightRecorder::get().mark_done(trace_id_, pg_->trace_pg_id_, spec_.p2p ? 0 : seq_, msg, steady_ns(finished_));
  // An op run when issued was never listed as outstanding: only its failure goes to the watchdog.
  if (error || !future_inline_) pg_->on_work_done(this);
}


}  // namespace npudist::hccl
