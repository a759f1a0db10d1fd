// NPUGraph: the capture registry, capture / replay / reset of a Graph, and the op and copy hooks
// (graph_capture.h, graph_internal.h, docs/graphs.md).
#include "graph/graph_internal.h"
#include "launch/launch.h"

#include <ATen/core/stack.h>
#include <ATen/record_function.h>
#include <torch/extension.h>

#include <fstream>
#include <sstream>
#include <unordered_set>

#include "npu_tensor.h"

namespace npudist::graph {

std::atomic<int> g_active_captures{0};
std::atomic<uint64_t> g_next_pool{1};

namespace {

const c10::DispatchKeySet kPythonKeys({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot});
std::mutex g_registry_mu;
std::vector<ActiveCapture> g_registry;

}  // namespace

Graph* capturing_graph(int device) {
  if (!any_capture_active()) return nullptr;
  int64_t stream = rt::api().get_stream(device);
  std::lock_guard<std::mutex> g(g_registry_mu);
  for (const ActiveCapture& a : g_registry) {
    if (a.device == device && a.stream == stream) return a.graph;
  }
  return nullptr;
}

// Work that bypasses the fallback and the copy kernel cannot be recorded: hccl collectives (c10d ops, run by
// the hccl backend on its own streams) and npu kernels of other libraries' operators (e.g. user C++ kernels on
// npu pointers). While a capture is active, a RecordFunction observer spots them on a capturing stream and
// invalidates that capture, so capture_end raises instead of a replay silently skipping them. Observers
// cannot raise into the op (RecordFunction swallows their exceptions), hence the deferred error.
static std::unique_ptr<at::ObserverContext> watch_op(const at::RecordFunction& fn) {
  std::optional<c10::OperatorName> name = fn.operator_name();
  if (!name) return nullptr;
  const std::string& n = name->name;
  const std::string ns = n.substr(0, n.find("::"));
  const bool collective = ns == "c10d" || ns == "_c10d_functional";
  if (!collective) {
    if (ns == "aten" || ns == "prim" || ns == "npu" || ns == n) return nullptr;
    auto op = c10::Dispatcher::singleton().findOp(*name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return nullptr;
  }
  Graph* graph = capturing_graph(rt::current_device());
  if (!graph) return nullptr;
  graph->invalidate(c10::str("The operator '", *name, "' is not permitted while an npu stream is capturing an "
                             "NPUGraph", kNotSupported, ": ", collective ? "hccl collectives run on hccl's own streams"
                                                      : "its npu kernel works on the npu bytes outside the fallback",
                             ", so a replay could not re-run it. Run it outside the captured region."));
  return nullptr;
}
static std::optional<at::CallbackHandle> g_watch_handle;  // guarded by g_registry_mu

static void register_locked(ActiveCapture capture) {  // caller holds g_registry_mu
  g_registry.push_back(capture);
  g_active_captures.fetch_add(1);
  launch::hold_synchronous(1);
  if (!g_watch_handle) {
    g_watch_handle = at::addGlobalCallback(at::RecordFunctionCallback(&watch_op).scopes({at::RecordScope::FUNCTION}));
  }
}

void register_capture(ActiveCapture capture) {
  std::lock_guard<std::mutex> g(g_registry_mu);
  for (const ActiveCapture& a : g_registry) {
    TORCH_CHECK(!(a.device == capture.device && a.stream == capture.stream), "stream ", capture.stream, " of npu:",
                capture.device, " is already capturing or updating a graph (ACL_ERROR_RT_STREAM_CAPTURED, error "
                "code 107027): end that capture or update first, or use another stream");
  }
  register_locked(capture);
}

Graph* graph_on_stream(int device, int64_t stream) {
  std::lock_guard<std::mutex> g(g_registry_mu);
  for (const ActiveCapture& a : g_registry) {
    if (a.device == device && a.stream == stream) return a.graph;
  }
  return nullptr;
}

void unregister(Graph* graph) {
  std::lock_guard<std::mutex> g(g_registry_mu);
  for (auto it = g_registry.begin(); it != g_registry.end(); ++it) {
    if (it->graph == graph) {
      g_registry.erase(it);
      g_active_captures.fetch_sub(1);
      launch::hold_synchronous(-1);
      if (g_registry.empty() && g_watch_handle) {
        at::removeCallback(*g_watch_handle);
        g_watch_handle.reset();
      }
      return;
    }
  }
}

constexpr const char* kGraphStreamHolder = "captured NPUGraphs (not reset)";

void Graph::give_stream_back() {
  if (!holds_stream_) return;
  (void)rt::api().stream_hold(device_, kGraphStreamHolder, 0);
  holds_stream_ = false;
}

Graph::~Graph() {
  unregister(this);
  std::lock_guard<std::mutex> g(mu_);
  give_stream_back();
}

void Graph::capture_begin(uint64_t pool, const std::string& mode_str) {
  Mode mode = parse_mode(mode_str);
  int device = rt::current_device();
  int64_t stream = rt::api().get_stream(device);
  TORCH_CHECK(stream != 0, "NPU graphs must be captured on a non-default stream (the current stream of npu:", device,
              " is its default stream). Capture under torch.npu.graph(g), which uses a side stream, or under "
              "torch.npu.stream(torch.npu.Stream()); after capture it is fine to replay on the default stream.");
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(state_ == State::kEmpty, "NPUGraph.capture_begin: this graph ",
              state_ == State::kCapturing ? "is already capturing" : "was already captured; call reset() first",
              " (ACL_ERROR_RT_MODEL_CAPTURED, error code 107026)");
  {
    std::lock_guard<std::mutex> r(g_registry_mu);
    for (const ActiveCapture& a : g_registry) {
      TORCH_CHECK(!(a.device == device && a.stream == stream), "NPUGraph.capture_begin: stream ", stream,
                  " of npu:", device, " is already capturing another graph (ACL_ERROR_RT_STREAM_CAPTURED, error "
                  "code 107027)");
    }
    if (rt::api().stream_hold(device, kGraphStreamHolder, 1) != NPUDIST_SUCCESS) {
      TORCH_CHECK(false, "NPUGraph.capture_begin: ", rt::api().last_error());
    }
    holds_stream_ = true;
    register_locked(ActiveCapture{this, device, stream, std::this_thread::get_id(), mode});
  }
  static std::atomic<uint64_t> next_capture_id{1};
  capture_id_ = next_capture_id.fetch_add(1);
  groups_.clear();
  open_group_.reset();
  scopes_.clear();
  open_scopes_.clear();
  super_kernel_optimized_ = false;
  state_ = State::kCapturing;
  device_ = device;
  stream_ = stream;
  pool_ = pool ? pool : g_next_pool.fetch_add(1);
  invalid_.clear();
}

void Graph::capture_end() {
  unregister(this);
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(state_ == State::kCapturing, "NPUGraph.capture_end: the graph is not capturing "
              "(ACL_ERROR_RT_STREAM_NOT_CAPTURED, error code 107029)");
  state_ = State::kCaptured;
  if (open_group_ && invalid_.empty()) {
    invalid_ = "graph_task_group_begin was called without its graph_task_group_end: end the task group on the "
               "capturing stream before capture_end";
  }
  open_group_.reset();
  if (invalid_.empty()) invalid_ = unclosed_scopes_locked();
  open_scopes_.clear();
  if (invalid_.empty()) {
    try {
      check_storages_unchanged();
    } catch (const c10::Error& e) {
      invalid_ = e.what_without_backtrace();
    }
  }
  if (!invalid_.empty()) {
    std::string why = invalid_;
    tasks_.clear();
    storages_.clear();
    groups_.clear();
    scopes_.clear();
    capture_id_ = 0;
    state_ = State::kEmpty;
    give_stream_back();
    TORCH_CHECK(false, "NPUGraph capture failed and was discarded (ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED, error "
                "code 507903): ", why);
  }
}

void Graph::check_storages_unchanged() const {
  for (const auto& [si, kept] : storages_) {
    TORCH_CHECK(si->data_ptr().get() == kept.second, "NPUGraph: a tensor the graph uses was resized or given new "
                "memory after it was captured (its bytes moved from ", kept.second, " to ", si->data_ptr().get(),
                "); a graph works on fixed addresses. Keep static tensors' sizes fixed (write into them with "
                "copy_) or re-capture the graph.");
  }
}

void Graph::replay() {
  TORCH_CHECK(capturing_graph(rt::current_device()) == nullptr,
              "NPUGraph.replay() is not permitted while the current npu stream is capturing");
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(state_ == State::kCaptured, "NPUGraph.replay: the graph ",
              state_ == State::kCapturing ? "is still capturing (call capture_end first)"
                                          : "has not been captured (or was reset)");
  check_storages_unchanged();
  DeviceScope ds(device_);
  if (!launch::may_queue()) {
    // On the calling thread, after the work queued before it on the current stream (filling static inputs);
    // work launched later is ordered after replay returns. (Eager ops run synchronously in these modes too.)
    launch::drain(device_);
    run_tasks(tasks_, {});
    return;
  }
  // Asynchronous launch: the replay is one queued task on the current stream, like a device graph launch:
  // ordered after the work queued before it and before the work queued after it, and the caller does not
  // wait for either (draining here cost a wake-up round trip with the stream's worker on every replay, more
  // than the ops of a small graph). A failing task is reported at the next synchronization point.
  std::vector<std::optional<at::Generator>> forks;
  forks.reserve(tasks_.size());
  for (const auto& t : tasks_) t->reserve_leaves(forks);
  launch::enqueue(device_, "NPUGraph.replay", [tasks = tasks_, forks = std::move(forks)]() {
    t_in_queued_replay = true;
    try {
      run_tasks(tasks, forks);
    } catch (...) {
      t_in_queued_replay = false;
      throw;
    }
    t_in_queued_replay = false;
  });
}

void Graph::run_tasks(const std::vector<std::shared_ptr<RecordedTask>>& tasks,
                      const std::vector<std::optional<at::Generator>>& forks) {
  // The recorded kernels are below autograd, as in eager (the fallback runs under the same guard), and a
  // replay is not Python's to see: the kernels' inner aten calls skip Python dispatch modes (as a device
  // graph replay would never reach them).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_python(kPythonKeys);
  size_t leaf = 0;  // forks holds one entry per leaf (a fused task has several), or none
  for (size_t i = 0; i < tasks.size(); ++i) {
    const std::optional<at::Generator>* task_forks = leaf < forks.size() ? &forks[leaf] : nullptr;
    leaf += tasks[i]->num_leaves();
    try {
      tasks[i]->run_leaves(task_forks);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "NPUGraph replay: task ", i, " (", tasks[i]->describe(), ") failed: ",
                  e.what_without_backtrace());
    }
  }
}

void Graph::reset() {
  unregister(this);
  std::lock_guard<std::mutex> g(mu_);
  // Queued replays hold the graph's tasks and buffers: wait for them and release them, so the graph's memory
  // is back in the allocator when reset returns. No error is raised here: a failed replay is reported at the
  // next synchronization point. (Queued replays do not take mu_.)
  if (state_ == State::kCaptured && !launch::blocking()) {
    (void)rt::api().device_synchronize(device_);
    launch::release_finished();
  }
  tasks_.clear();
  storages_.clear();
  groups_.clear();
  open_group_.reset();
  scopes_.clear();
  open_scopes_.clear();
  super_kernel_optimized_ = false;
  update_.reset();  // an update in progress ends with the graph (its registry entry went above)
  capture_id_ = 0;  // handles of this capture are refused from now on
  state_ = State::kEmpty;
  invalid_.clear();
  give_stream_back();
}

void Graph::debug_dump(const std::string& path) const {
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(state_ == State::kCaptured, "NPUGraph.debug_dump: the graph has not been captured");
  std::ofstream out(path);
  TORCH_CHECK_VALUE(out.good(), "NPUGraph.debug_dump: cannot open '", path, "' for writing");
  out << "NPUGraph on npu:" << device_ << " captured on stream " << stream_ << ", pool " << pool_ << ": "
      << tasks_.size() << " tasks, " << storages_.size() << " storages kept\n";
  for (size_t i = 0; i < tasks_.size(); ++i) out << "  [" << i << "] " << tasks_[i]->describe() << "\n";
  TORCH_CHECK(out.good(), "NPUGraph.debug_dump: writing '", path, "' failed");
}

void Graph::add_task(std::unique_ptr<RecordedTask> task, const std::vector<c10::StorageImpl*>& storages) {
  std::lock_guard<std::mutex> g(mu_);
  for (c10::StorageImpl* si : storages) task->storages.push_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(si));
  if (update_) {  // re-issued on the update stream: replaces the group's tasks at graph_task_update_end
    if (update_->invalid.empty()) update_->tasks.push_back(std::move(task));
    return;
  }
  if (state_ != State::kCapturing || !invalid_.empty()) return;
  for (const auto& si : task->storages) storages_.try_emplace(si.get(), si, si->data_ptr().get());
  tasks_.push_back(std::move(task));
}

void Graph::invalidate(const std::string& why) {
  std::lock_guard<std::mutex> g(mu_);
  if (update_) {
    if (update_->invalid.empty()) update_->invalid = why;
    return;
  }
  if (state_ == State::kCapturing && invalid_.empty()) invalid_ = why;
}

void Graph::fail(const std::string& why) {
  invalidate(why);
  TORCH_CHECK(false, why);
}

static bool returns_only_tensors(const c10::FunctionSchema& schema) {
  for (const c10::Argument& r : schema.returns()) {
    const c10::TypePtr& t = r.type();
    bool ok = t->kind() == c10::TypeKind::TensorType ||
              (t->kind() == c10::TypeKind::ListType &&
               t->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType);
    if (!ok) return false;
  }
  return true;
}

// Indexing ops carry the dynamic_output_shape tag because a boolean mask makes the result's shape depend on
// the mask's values. index_put keeps self's shape whatever the indices, and index with integer indices has a
// shape fixed by the indices' shapes: both replay correctly.
static bool has_static_shape_here(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack, size_t nargs) {
  const std::string& n = op.schema().operator_name().name;
  if (n == "aten::index_put" || n == "aten::index_put_" || n == "aten::_index_put_impl_") return true;
  if (n != "aten::index") return false;
  for (size_t i = stack.size() - nargs; i < stack.size(); ++i) {
    if (!stack[i].isList()) continue;
    for (const c10::IValue& e : stack[i].toListRef()) {
      if (e.isTensor() && (e.toTensor().scalar_type() == at::kBool || e.toTensor().scalar_type() == at::kByte)) {
        return false;
      }
    }
  }
  return true;
}

// ------------------------------------------------------------------------------------------------
// Hooks
// ------------------------------------------------------------------------------------------------
void check_not_capturing(const char* what) {
  std::lock_guard<std::mutex> g(g_registry_mu);
  for (const ActiveCapture& a : g_registry) {
    bool own_stream = rt::api().get_stream(a.device) == a.stream;
    bool forbidden = own_stream || a.mode == Mode::kGlobal ||
                     (a.mode == Mode::kThreadLocal && a.thread == std::this_thread::get_id());
    TORCH_CHECK(!forbidden, what, " is not permitted while an npu stream is capturing an NPUGraph "
                "(ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, error code 107030: the current capture mode does not "
                "support this operation; operation not permitted when stream is capturing: stream ", a.stream, " of npu:",
                a.device, ", capture_error_mode='", mode_name(a.mode), "'). Move it out of the captured region",
                own_stream ? "." : ", or capture with capture_error_mode='relaxed' if this thread's call is safe.");
  }
}

struct OpRecording {
  Graph* graph;
  std::unique_ptr<OpTask> task;
  std::vector<c10::StorageImpl*> storages;
  std::vector<const void*> addresses;  // of `storages` before the kernel ran
  std::vector<size_t> nbytes;          // of `storages` before the kernel ran
  // Recorded tensor arguments that alias an npu storage (the CPU alias's context is that storage): index, storage.
  std::vector<std::pair<size_t, c10::StorageImpl*>> aliased_args;
};

void OpRecordingDeleter::operator()(OpRecording* r) const { delete r; }

OpRecordingPtr begin_op(const c10::OperatorHandle& op, int device, const torch::jit::Stack& stack,
                                      size_t nargs, bool has_cpu_tensor_args, int64_t generator_slot,
                                      c10::GeneratorImpl* generator,
                                      const std::vector<c10::StorageImpl*>& npu_storages) {
  Graph* graph = capturing_graph(device);
  if (!graph) return nullptr;
  const c10::OperatorName& name = op.schema().operator_name();
  if ((op.hasTag(at::Tag::dynamic_output_shape) && !has_static_shape_here(op, stack, nargs)) ||
      op.hasTag(at::Tag::data_dependent_output) || !returns_only_tensors(op.schema())) {
    graph->fail(c10::str("The operator '", name, "' is not permitted while an npu stream is capturing an NPUGraph",
                         kNotSupported, ": ",
                         "its output ", op.hasTag(at::Tag::dynamic_output_shape) ? "shape depends on the input values"
                                                                               : "is a host value read from the device",
                         ", which a replay cannot reproduce. Run it outside the captured region."));
  }
  if (has_cpu_tensor_args) {
    graph->fail(c10::str("The operator '", name, "' is not permitted while an npu stream is capturing an NPUGraph",
                         kNotSupported, ": ",
                         "it takes a CPU tensor argument (host memory read at launch). Move that tensor to npu "
                         "before capture."));
  }
  OpRecordingPtr rec(new OpRecording());
  rec->graph = graph;
  rec->task = std::make_unique<OpTask>(op);
  rec->task->args.assign(stack.end() - static_cast<std::ptrdiff_t>(nargs), stack.end());
  rec->task->generator_slot = generator_slot;
  if (generator) rec->task->generator = at::Generator(c10::intrusive_ptr<c10::GeneratorImpl>::reclaim_copy(generator));
  rec->storages = npu_storages;
  for (c10::StorageImpl* si : npu_storages) {
    rec->addresses.push_back(si->data_ptr().get());
    rec->nbytes.push_back(si->nbytes());
  }
  const std::unordered_set<c10::StorageImpl*> npu_set(npu_storages.begin(), npu_storages.end());
  for (size_t j = 0; j < rec->task->args.size(); ++j) {
    const c10::IValue& v = rec->task->args[j];
    if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().has_storage()) continue;
    auto* si = static_cast<c10::StorageImpl*>(v.toTensor().storage().data_ptr().get_context());
    if (npu_set.count(si)) rec->aliased_args.emplace_back(j, si);
  }
  return rec;
}

void end_op(OpRecordingPtr rec, const torch::jit::Stack& stack, size_t nret, uint64_t random_numel) {
  OpTask& task = *rec->task;
  const c10::OperatorName& name = task.op.schema().operator_name();
  std::unordered_set<const void*> argument_bytes;
  for (size_t i = 0; i < rec->storages.size(); ++i) {
    c10::StorageImpl* si = rec->storages[i];
    if (si->data_ptr().get() != rec->addresses[i] && rec->nbytes[i] == 0) {
      // An empty out= argument the kernel sized (a composite op's `at::empty({0})` + `op.out`, e.g. abs): nothing
      // read the old (empty) bytes, so the graph takes the new ones. The recorded argument is made an alias of
      // them, at the geometry the kernel gave it, so a replay writes there instead of resizing again.
      for (const auto& [j, arg_si] : rec->aliased_args) {
        if (arg_si != si) continue;
        const at::Tensor old = task.args[j].toTensor();
        task.args[j] = at::empty({0}, old.options()).set_(cpu_storage_alias(si), old.storage_offset(), old.sizes(),
                                                           old.strides());
      }
      argument_bytes.insert(si->data_ptr().get());
      continue;
    }
    if (si->data_ptr().get() != rec->addresses[i]) {
      rec->graph->fail(c10::str("The operator '", name, "' resized its output during NPUGraph capture (new memory "
                                "for an argument); a graph works on fixed addresses. Pass out= tensors of the "
                                "right size, or let the op allocate its result."));
    }
    argument_bytes.insert(rec->addresses[i]);
  }
  task.nret = nret;
  task.random_numel = random_numel;
  const size_t base = stack.size() - nret;
  auto consider = [&](const at::Tensor& t, size_t ret, int64_t list_index) {
    if (!t.defined() || t.device().type() != kNpu || t.storage().nbytes() == 0) return;
    if (argument_bytes.count(t.storage().data_ptr().get())) return;  // in-place, out= or a view of an argument
    task.outputs.push_back(StaticOutput{ret, list_index, cpu_alias(t)});
    rec->storages.push_back(storage_of(t));
  };
  for (size_t i = 0; i < nret; ++i) {
    const c10::IValue& v = stack[base + i];
    if (v.isTensor()) {
      consider(v.toTensor(), i, -1);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) consider(list.get(j), i, static_cast<int64_t>(j));
    }
  }
  rec->graph->add_task(std::move(rec->task), rec->storages);
}

void on_copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  bool src_npu = src.device().type() == kNpu, dst_npu = dst.device().type() == kNpu;
  if (!src_npu || !dst_npu) {
    check_not_capturing(src_npu ? "Copying an npu tensor to the host (.cpu(), .to('cpu'), .numpy(), .tolist())"
                                : "Copying a host tensor to npu (.to('npu'), torch.tensor(..., device='npu'))");
    return;
  }
  Graph* graph = capturing_graph(dst.device().index());
  if (!graph) return;
  graph->add_task(std::make_unique<CopyTask>(cpu_alias(src), cpu_alias(dst), non_blocking),
                  {storage_of(src), storage_of(dst)});
}

}  // namespace npudist::graph
