// NPUGraph task groups and their updates (torch.npu.graph_task_group_begin/_end, graph_task_update_begin/_end;
// docs/graph_task_update.md). A group is the run of tasks a capturing stream recorded between begin and end. An
// update re-issues the same ops on an update stream: they run and are recorded as in a capture, and at
// graph_task_update_end they replace the group's tasks, so later replays run them with the new arguments. A
// result whose shape the new arguments keep is written where the captured result lives, so tensors that read
// it (tasks after the group, the caller's result tensor) see the new values.
#include <torch/extension.h>

#include <sstream>
#include <unordered_set>

#include "graph/graph_internal.h"
#include "npu_tensor.h"

namespace npudist::graph {

namespace {

std::string names_of(const TaskList& tasks, size_t begin, size_t end) {
  std::ostringstream os;
  os << "[";
  for (size_t i = begin; i < end; ++i) os << (i > begin ? ", " : "") << tasks[i]->name();
  os << "]";
  return os.str();
}

// The captured storage a re-issued task's result is redirected to: the CPU storage its tasks' aliases use, and
// the npu storage that keeps its bytes alive.
struct Redirect {
  c10::Storage cpu;
  c10::intrusive_ptr<c10::StorageImpl> npu;
};
using RedirectMap = std::unordered_map<const void*, Redirect>;

at::Tensor redirect(const at::Tensor& t, const RedirectMap& map) {
  if (!t.defined()) return t;
  auto it = map.find(t.storage().data_ptr().get());
  if (it == map.end()) return t;
  return at::empty({0}, t.options()).set_(it->second.cpu, t.storage_offset(), t.sizes(), t.strides());
}

c10::IValue redirect(const c10::IValue& v, const RedirectMap& map) {
  if (v.isTensor()) return redirect(v.toTensor(), map);
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(redirect(t, map));
    return out;
  }
  if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {  // Tensor?[] (indices)
    c10::List<std::optional<at::Tensor>> out;
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(e.isTensor() ? std::optional<at::Tensor>(redirect(e.toTensor(), map)) : std::nullopt);
    }
    return out;
  }
  return v;
}

// Whether `task` reads or writes the bytes of the CPU storage at `data`.
bool touches(const RecordedTask& task, const void* data) {
  auto same = [&](const at::Tensor& t) { return t.defined() && t.storage().data_ptr().get() == data; };
  if (auto* op = dynamic_cast<const OpTask*>(&task)) {
    for (const c10::IValue& v : op->args) {
      if (v.isTensor() && same(v.toTensor())) return true;
      if (v.isList()) {
        for (const c10::IValue& e : v.toListRef()) {
          if (e.isTensor() && same(e.toTensor())) return true;
        }
      }
    }
    return false;
  }
  if (auto* copy = dynamic_cast<const CopyTask*>(&task)) return same(copy->src) || same(copy->dst);
  if (auto* fused = dynamic_cast<const FusedTask*>(&task)) {  // a super kernel touches what its sub-kernels do
    for (const auto& sub : fused->subtasks) {
      if (touches(*sub, data)) return true;
    }
  }
  return false;
}

template <typename F>
void for_each_tensor(const RecordedTask& task, F&& f) {
  if (auto* op = dynamic_cast<const OpTask*>(&task)) {
    for (const c10::IValue& v : op->args) {
      if (v.isTensor() && v.toTensor().defined()) f(v.toTensor());
      if (v.isList()) {
        for (const c10::IValue& e : v.toListRef()) {
          if (e.isTensor() && e.toTensor().defined()) f(e.toTensor());
        }
      }
    }
    for (const StaticOutput& o : op->outputs) f(o.alias);
  } else if (auto* copy = dynamic_cast<const CopyTask*>(&task)) {
    f(copy->src);
    f(copy->dst);
  }
}

// The (captured, re-issued) tensor pairs at the positions the op writes (in-place / out= arguments, a copy's
// destination). The tasks have the same op (checked before).
std::vector<std::pair<at::Tensor, at::Tensor>> written_pairs(const RecordedTask& old_task, const RecordedTask& fresh) {
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  if (auto* copy = dynamic_cast<const CopyTask*>(&old_task)) {
    pairs.emplace_back(copy->dst, static_cast<const CopyTask&>(fresh).dst);
    return pairs;
  }
  auto* op = dynamic_cast<const OpTask*>(&old_task);
  if (!op) return pairs;
  auto& fop = static_cast<const OpTask&>(fresh);
  const auto& schema = op->op.schema().arguments();
  for (size_t j = 0; j < op->args.size() && j < fop.args.size() && j < schema.size(); ++j) {
    const c10::AliasInfo* alias = schema[j].alias_info();
    if (!alias || !alias->isWrite()) continue;
    const c10::IValue &o = op->args[j], &f = fop.args[j];
    if (o.isTensor() && f.isTensor() && o.toTensor().defined() && f.toTensor().defined()) {
      pairs.emplace_back(o.toTensor(), f.toTensor());
    } else if (o.isTensorList() && f.isTensorList() && o.toTensorList().size() == f.toTensorList().size()) {
      for (size_t e = 0; e < o.toTensorList().size(); ++e) pairs.emplace_back(o.toTensorList().get(e), f.toTensorList().get(e));
    }
  }
  return pairs;
}

const StaticOutput* find_output(const OpTask& task, size_t ret, int64_t list_index) {
  for (const StaticOutput& o : task.outputs) {
    if (o.ret == ret && o.list_index == list_index) return &o;
  }
  return nullptr;
}

c10::intrusive_ptr<c10::StorageImpl> npu_storage_of(const RecordedTask& task, const void* data) {
  for (const auto& si : task.storages) {
    if (si->data_ptr().get() == data) return si;
  }
  return {};
}

}  // namespace

void Graph::group_begin() {
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(state_ == State::kCapturing, "graph_task_group_begin: the graph is not capturing");
  TORCH_CHECK(!open_group_, "graph_task_group_begin: a task group is already open on this capture (groups do not "
              "nest); call graph_task_group_end(stream) first");
  open_group_ = tasks_.size();
}

TaskGroupHandle Graph::group_end() {
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(state_ == State::kCapturing, "graph_task_group_end: the graph is not capturing");
  TORCH_CHECK(open_group_, "graph_task_group_end without graph_task_group_begin: call "
              "graph_task_group_begin(stream) before the ops of the group");
  groups_.push_back(Group{*open_group_, tasks_.size()});
  open_group_.reset();
  return TaskGroupHandle{weak_from_this(), capture_id_, groups_.size() - 1};
}

void Graph::update_begin(const TaskGroupHandle& handle, int device, int64_t stream) {
  {
    std::lock_guard<std::mutex> g(mu_);
    TORCH_CHECK(capture_id_ != 0 && handle.capture_id == capture_id_, "graph_task_update_begin: the handle belongs "
                "to an earlier capture of this graph (it was reset or re-captured since); use a handle that "
                "graph_task_group_end returned during the graph's current capture");
    TORCH_CHECK(state_ == State::kCaptured, "graph_task_update_begin: the graph is still capturing; call "
                "capture_end (leave the torch.npu.graph block) before updating its task groups");
    TORCH_CHECK(!update_, "graph_task_update_begin: an update of this graph is already in progress on stream ",
                update_ ? update_->stream : 0, "; call graph_task_update_end on that stream first");
    TORCH_CHECK(device == device_, "graph_task_update_begin: the update stream is on npu:", device,
                " but the graph was captured on npu:", device_, "; use a stream of npu:", device_);
    TORCH_CHECK(stream != stream_, "graph_task_update_begin: the update stream is the graph's capture stream; "
                "update on another stream (torch.npu.Stream())");
  }
  // Registered like a capture: ops on the update stream are recorded (and run) on the calling thread. Host
  // synchronisation on the update stream is refused as during a capture; other threads are not restricted.
  register_capture(ActiveCapture{this, device, stream, std::this_thread::get_id(), Mode::kRelaxed});
  std::lock_guard<std::mutex> g(mu_);
  update_ = Update{handle.group, stream, {}, {}};
}

void Graph::update_end() {
  unregister(this);
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(update_, "graph_task_update_end: no update of this graph is in progress");
  Update update = std::move(*update_);
  update_.reset();
  TORCH_CHECK(update.invalid.empty(), "graph_task_update_end: the update was discarded and task group ",
              update.group, " keeps its tasks: ", update.invalid);
  update_ = std::move(update);
  try {
    apply_update_locked();
  } catch (...) {
    update_.reset();
    throw;
  }
  update_.reset();
}

void Graph::apply_update_locked() {
  const Group grp = groups_.at(update_->group);
  TaskList& fresh = update_->tasks;
  const size_t n = grp.end - grp.begin;
  TORCH_CHECK_VALUE(fresh.size() == n, "graph_task_update_end: task group ", update_->group, " recorded ", n,
                    " tasks ", names_of(tasks_, grp.begin, grp.end), " but the update issued ", fresh.size(), " ",
                    names_of(fresh, 0, fresh.size()), "; re-issue the same ops as the group's capture, changing "
                    "only their arguments");
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(fresh[i]->name() == tasks_[grp.begin + i]->name(), "graph_task_update_end: task ", i,
                      " of group ", update_->group, " was captured as ", tasks_[grp.begin + i]->name(),
                      " but the update issued ", fresh[i]->name(), "; re-issue the same ops in the same order");
  }
  // Results of the re-issued ops that keep their captured shape are redirected to the captured results, so the
  // group keeps writing where later tasks and the caller read.
  RedirectMap map;
  std::vector<std::pair<std::string, at::Tensor>> changed;  // captured results whose shape the update changes
  for (size_t i = 0; i < n; ++i) {
    auto* old_op = dynamic_cast<OpTask*>(tasks_[grp.begin + i].get());
    auto* new_op = dynamic_cast<OpTask*>(fresh[i].get());
    if (!old_op || !new_op) continue;
    for (const StaticOutput& o : old_op->outputs) {
      const StaticOutput* f = find_output(*new_op, o.ret, o.list_index);
      const bool same = f && f->alias.sizes() == o.alias.sizes() && f->alias.strides() == o.alias.strides() &&
                        f->alias.scalar_type() == o.alias.scalar_type() &&
                        f->alias.storage().nbytes() == o.alias.storage().nbytes() &&
                        f->alias.storage_offset() == o.alias.storage_offset();
      if (!same) {
        changed.emplace_back(old_op->name(), o.alias);
        continue;
      }
      map.emplace(f->alias.storage().data_ptr().get(),
                  Redirect{o.alias.storage(), npu_storage_of(*old_op, o.alias.storage().data_ptr().get())});
    }
  }
  // Buffers the group allocates and then writes through in-place / out= ops (a padded result: empty, fill_,
  // copy_ into a slice) are the group's results too: a written argument whose buffer the update's tasks did not
  // use before is paired with the captured task's argument at the same position.
  std::unordered_set<const void*> seen;
  for (size_t i = 0; i < n; ++i) {
    const RecordedTask& old_task = *tasks_[grp.begin + i];
    std::vector<std::pair<at::Tensor, at::Tensor>> written = written_pairs(old_task, *fresh[i]);
    for (const auto& [o, f] : written) {
      const void* fd = f.storage().data_ptr().get();
      const void* od = o.storage().data_ptr().get();
      if (fd == od || seen.count(fd) || map.count(fd)) continue;
      if (f.storage().nbytes() == o.storage().nbytes() && f.scalar_type() == o.scalar_type()) {
        map.emplace(fd, Redirect{o.storage(), npu_storage_of(old_task, od)});
      } else {
        changed.emplace_back(old_task.name(), o);
      }
    }
    for_each_tensor(*fresh[i], [&](const at::Tensor& t) { seen.insert(t.storage().data_ptr().get()); });
  }
  for (const auto& [name, old] : changed) {
    const void* data = old.storage().data_ptr().get();
    for (size_t j = 0; j < tasks_.size(); ++j) {
      if (j >= grp.begin && j < grp.end) continue;
      TORCH_CHECK_VALUE(!touches(*tasks_[j], data), "graph_task_update_end: the update changes a result of ", name,
                        " (captured as ", describe_tensor(old), ") which task ", j, " outside the group reads; a "
                        "group's results used after it must keep their shape, dtype and layout under the new "
                        "arguments");
    }
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  for (auto& task : fresh) {
    if (auto* op = dynamic_cast<OpTask*>(task.get())) {
      for (c10::IValue& v : op->args) v = redirect(v, map);
      for (StaticOutput& o : op->outputs) o.alias = redirect(o.alias, map);
    } else if (auto* copy = dynamic_cast<CopyTask*>(task.get())) {
      copy->src = redirect(copy->src, map);
      copy->dst = redirect(copy->dst, map);
    }
    for (auto& si : task->storages) {
      auto it = map.find(si->data_ptr().get());
      if (it != map.end() && it->second.npu) si = it->second.npu;
    }
  }
  for (size_t i = 0; i < n; ++i) tasks_[grp.begin + i] = fresh[i];
  rebuild_storages_locked();
}

void Graph::rebuild_storages_locked() {
  // The storages the graph keeps are its tasks' storages: replaced tasks' intermediates are let go (queued
  // replays that still run the replaced tasks hold them through those tasks). Captured addresses are kept, so
  // a storage moved since capture is still reported.
  decltype(storages_) kept;
  for (const auto& task : tasks_) {
    for (const auto& si : task->storages) {
      auto old = storages_.find(si.get());
      kept.try_emplace(si.get(), si, old != storages_.end() ? old->second.second : si->data_ptr().get());
    }
  }
  storages_ = std::move(kept);
}

namespace {

Graph* capturing_stream_graph(const char* call, int device, int64_t stream) {
  Graph* graph = graph_on_stream(device, stream);
  TORCH_CHECK(graph && !graph->updating(), call, ": stream ", stream, " of npu:", device, " is not capturing an "
              "NPUGraph; call it on the capturing stream between capture_begin and capture_end (inside "
              "torch.npu.graph(g), with torch.npu.current_stream())");
  return graph;
}

}  // namespace

void init_task_group_bindings(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<TaskGroupHandle>(m, "_GraphTaskGroup")
      .def_property_readonly("group", [](const TaskGroupHandle& h) { return h.group; })
      .def("__repr__", [](const TaskGroupHandle& h) {
        return c10::str("<NPUGraph task group ", h.group, (h.graph.expired() ? " of a deleted graph>" : ">"));
      });
  m.def("_graph_task_group_begin", [](int device, int64_t stream) {
    capturing_stream_graph("graph_task_group_begin", device, stream)->group_begin();
  });
  m.def("_graph_task_group_end", [](int device, int64_t stream) {
    return capturing_stream_graph("graph_task_group_end", device, stream)->group_end();
  });
  m.def("_graph_task_update_begin", [](int device, int64_t stream, const TaskGroupHandle& handle) {
    std::shared_ptr<Graph> graph = handle.graph.lock();
    TORCH_CHECK(graph, "graph_task_update_begin: the handle's NPUGraph was deleted; capture the graph again and "
                "update with a handle of the new capture");
    graph->update_begin(handle, device, stream);
  });
  m.def("_graph_task_update_end", [](int device, int64_t stream) {
    Graph* graph = graph_on_stream(device, stream);
    TORCH_CHECK(graph && graph->updating(), "graph_task_update_end: stream ", stream, " of npu:", device,
                " is not updating a task group; call graph_task_update_begin(stream, handle) first, on the same "
                "stream");
    graph->update_end();
  });
}

}  // namespace npudist::graph
