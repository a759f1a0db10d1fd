// NPUGraph internals shared by the graph_*.cpp files (not part of graph_capture.h's hook interface): the recorded
// tasks, the Graph, and the registry of captures in progress. Includes torch headers; the hook header does not.
#pragma once
#include "graph/graph_capture.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace npudist::graph {

// CANN's code for an operation the capture mode does not support: every refusal of a capture carries it, the code
// Ascend users search for.
constexpr const char* kNotSupported = " (ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, error code 107030)";

enum class Mode { kGlobal, kThreadLocal, kRelaxed };
Mode parse_mode(const std::string& m);
const char* mode_name(Mode m);

std::string describe_tensor(const at::Tensor& t);
std::string describe_value(const c10::IValue& v);
inline c10::StorageImpl* storage_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

// ------------------------------------------------------------------------------------------------
// Recorded tasks (graph_tasks.cpp)
// ------------------------------------------------------------------------------------------------
struct RecordedTask {
  virtual ~RecordedTask() = default;
  // Runs the recorded kernel. `forked`: the random stream reserve_random() set aside for it at launch, or null
  // to take it from the npu generator now.
  virtual void run(const at::Generator* forked) = 0;
  // A random op reserves its random stream (and advances the npu generator) when the replay is launched, so
  // random ops take their numbers in launch order, as eager asynchronous ops do; others return nothing.
  virtual std::optional<at::Generator> reserve_random() { return std::nullopt; }
  // A replay's random streams, one entry per recorded kernel (leaf): a fused task (FusedTask) holds several.
  virtual size_t num_leaves() const { return 1; }
  virtual void reserve_leaves(std::vector<std::optional<at::Generator>>& out) { out.push_back(reserve_random()); }
  // Runs the task; `forks`: its num_leaves() entries of what reserve_leaves gave, or null (synchronous replay).
  virtual void run_leaves(const std::optional<at::Generator>* forks) {
    run(forks && forks[0] ? &*forks[0] : nullptr);
  }
  virtual std::string describe() const = 0;
  // What a task-group update compares between the captured and the re-issued tasks (the op's name).
  virtual std::string name() const = 0;
  // The npu storages the task touches, kept alive by the task itself: a queued replay holds its tasks, so a
  // task-group update that replaces them (and drops their storages from the graph) cannot free bytes under it.
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> storages;
};

// A fresh (functional) result of a recorded op: replay copies the kernel's new result into it.
struct StaticOutput {
  size_t ret;
  int64_t list_index;  // -1 for a Tensor return, else the element of a Tensor[] return
  at::Tensor alias;    // CPU alias of the npu output captured
};

struct OpTask final : RecordedTask {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;  // CPU aliases of the npu arguments, other arguments as given
  size_t nret = 0;
  int64_t generator_slot = -1;
  at::Generator generator;  // npu generator advanced like eager (generator_slot >= 0)
  uint64_t random_numel = 0;
  std::vector<StaticOutput> outputs;

  explicit OpTask(const c10::OperatorHandle& h) : op(h) {}
  void run(const at::Generator* forked) override;
  std::optional<at::Generator> reserve_random() override;
  std::string describe() const override;
  std::string name() const override;
};

struct CopyTask final : RecordedTask {
  at::Tensor src, dst;  // CPU aliases
  bool non_blocking;
  CopyTask(at::Tensor s, at::Tensor d, bool nb) : src(std::move(s)), dst(std::move(d)), non_blocking(nb) {}
  void run(const at::Generator*) override { dst.copy_(src, non_blocking); }
  std::string describe() const override { return "copy " + describe_tensor(src) + " -> " + describe_tensor(dst); }
  std::string name() const override { return "copy"; }
};

using TaskList = std::vector<std::shared_ptr<RecordedTask>>;

// A super kernel (NPUGraph.super_kernel_optimize, graph_super_kernel.cpp): the tasks of one super-kernel scope
// fused into one task, one launch at replay. Its sub-kernels run in waves: the sub-kernels of a wave touch no
// bytes another of the wave writes, and run concurrently; the fused task synchronizes (joins) between waves.
// debug_sync_all=1 makes every sub-kernel its own wave.
struct FusedTask final : RecordedTask {
  std::string scope;                // the scope's name ("None" for an unnamed scope)
  TaskList subtasks;
  std::vector<size_t> wave_starts;  // index of each wave's first sub-kernel, ascending, starting at 0
  size_t num_leaves() const override;
  void reserve_leaves(std::vector<std::optional<at::Generator>>& out) override;
  void run_leaves(const std::optional<at::Generator>* forks) override;
  void run(const at::Generator* forked) override;
  std::string describe() const override;
  std::string name() const override { return "super_kernel(" + scope + ")"; }
};

// torch.npu.ExternalEvent's state (graph_external_event.cpp): a flag that record() sets and reset() clears; a
// wait() blocks until it is set, so unlike an Event it may be waited on before it is recorded.
struct ExternalEventState {
  std::mutex mu;
  std::condition_variable cv;
  bool recorded = false;
  void record();
  void reset();
  // Blocks until recorded. `may_block`: false when waiting would block the only thread that could record it
  // (synchronous launch): then raises, naming `what`, instead of hanging.
  void wait(bool may_block, const char* what);
};

// An ExternalEvent record / wait / reset issued on a capturing stream: a node of the graph, run by each replay.
struct ExternalEventTask final : RecordedTask {
  enum class Kind { kRecord, kWait, kReset };
  std::shared_ptr<ExternalEventState> event;
  Kind kind;
  ExternalEventTask(std::shared_ptr<ExternalEventState> e, Kind k) : event(std::move(e)), kind(k) {}
  void run(const at::Generator*) override;
  std::string describe() const override { return name(); }
  std::string name() const override;
};

// True on a stream worker running a queued replay: an ExternalEvent wait there may block until another stream
// records the event. A replay on the calling thread (synchronous launch) raises instead.
extern thread_local bool t_in_queued_replay;

// A task group's handle (graph_task_group_end's return): the graph, which capture of it, and which group.
struct TaskGroupHandle {
  std::weak_ptr<class Graph> graph;
  uint64_t capture_id;
  size_t group;
};

// ------------------------------------------------------------------------------------------------
// Graph (graph_capture.cpp; task groups and their updates in graph_task_group.cpp)
// ------------------------------------------------------------------------------------------------
extern std::atomic<uint64_t> g_next_pool;

class Graph : public std::enable_shared_from_this<Graph> {
 public:
  ~Graph();

  void capture_begin(uint64_t pool, const std::string& mode);
  void capture_end();
  void replay();
  static void run_tasks(const TaskList& tasks, const std::vector<std::optional<at::Generator>>& forks);
  void reset();
  uint64_t pool() const {
    TORCH_CHECK(pool_ != 0, "NPUGraph.pool(): the graph has not been captured (call capture_begin first)");
    return pool_;
  }
  void debug_dump(const std::string& path) const;
  size_t num_tasks() const {
    std::lock_guard<std::mutex> g(mu_);
    return tasks_.size();
  }

  // Called by the hooks while capturing (from any thread running ops on the capturing stream).
  void add_task(std::unique_ptr<RecordedTask> task, const std::vector<c10::StorageImpl*>& storages);
  // Marks the capture failed (capture_end raises `why`); fail() also raises it now.
  void invalidate(const std::string& why);
  [[noreturn]] void fail(const std::string& why);

  // Task groups and their updates (graph_task_group.cpp, docs/graph_task_update.md).
  void group_begin();
  TaskGroupHandle group_end();
  void update_begin(const TaskGroupHandle& handle, int device, int64_t stream);
  void update_end();
  bool updating() const {
    std::lock_guard<std::mutex> g(mu_);
    return update_.has_value();
  }
  size_t num_groups() const {
    std::lock_guard<std::mutex> g(mu_);
    return groups_.size();
  }

  // Super-kernel scopes and their fusion (graph_super_kernel.cpp, docs/graphs.md "Super kernels"). `name`: the
  // scope_name, nullopt for None.
  void scope_begin(const std::optional<std::string>& name);
  void scope_end(const std::optional<std::string>& name);
  void super_kernel_optimize(bool sync_all, bool fuse_event_waits);
  size_t num_scopes() const {
    std::lock_guard<std::mutex> g(mu_);
    return scopes_.size();
  }

 private:
  // Replaces the group's tasks with the update's (caller holds mu_); raises on a mismatch, leaving the graph as
  // it was.
  void apply_update_locked();
  void rebuild_storages_locked();
  void check_storages_unchanged() const;  // caller holds mu_
  void give_stream_back();                 // caller holds mu_
  // At capture_end (caller holds mu_): the error naming scopes left open, or "" when every scope was closed.
  std::string unclosed_scopes_locked() const;

  // From capture_begin until reset (or destruction) the graph holds one stream of its device's budget: the
  // capture model's stream, as a captured aclmdlRI holds its streams until aclmdlRIDestroy.
  bool holds_stream_ = false;

  enum class State { kEmpty, kCapturing, kCaptured };
  mutable std::mutex mu_;
  State state_ = State::kEmpty;
  int device_ = -1;
  int64_t stream_ = 0;
  uint64_t pool_ = 0;
  std::string invalid_;
  TaskList tasks_;  // shared with queued replays (a reset may come before they ran)
  // The graph's private pool: every storage a task touches, kept alive, with its address at capture.
  std::unordered_map<c10::StorageImpl*, std::pair<c10::intrusive_ptr<c10::StorageImpl>, const void*>> storages_;

  // Which capture this is: handles of an earlier capture (before a reset) are refused.
  uint64_t capture_id_ = 0;
  struct Group {
    size_t begin, end;  // tasks_[begin, end)
  };
  std::vector<Group> groups_;
  std::optional<size_t> open_group_;  // tasks_.size() at graph_task_group_begin
  // Super-kernel scopes: closed ones (tasks_[begin, end)) and those begun and not yet ended, in begin order.
  struct Scope {
    std::optional<std::string> name;
    size_t begin, end;
  };
  std::vector<Scope> scopes_, open_scopes_;
  bool super_kernel_optimized_ = false;
  // An update in progress: the tasks the update stream issued since graph_task_update_begin.
  struct Update {
    size_t group;
    int64_t stream;
    TaskList tasks;
    std::string invalid;
  };
  std::optional<Update> update_;
};

// ------------------------------------------------------------------------------------------------
// The captures in progress: which (device, stream) records into which graph (graph_capture.cpp).
// ------------------------------------------------------------------------------------------------
struct ActiveCapture {
  Graph* graph;
  int device;
  int64_t stream;
  std::thread::id thread;
  Mode mode;
};

// The graph capturing the calling thread's current stream on `device`, if any.
Graph* capturing_graph(int device);
// The graph capturing (or updating through) `stream` of `device`, if any.
Graph* graph_on_stream(int device, int64_t stream);
// Add / remove a registry entry (capture or update); register_capture takes g_registry_mu itself.
void register_capture(ActiveCapture capture);
void unregister(Graph* graph);

// Python bindings of graph_task_group.cpp and graph_external_event.cpp, called from init_bindings.
void init_task_group_bindings(pybind11::module_& m);
void init_external_event_bindings(pybind11::module_& m);
void init_super_kernel_bindings(pybind11::module_& m);

}  // namespace npudist::graph
