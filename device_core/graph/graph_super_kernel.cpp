// NPUGraph super kernels (torch.npu.super_kernel_scope_begin / _end, NPUGraph.super_kernel_optimize; docs/graphs.md
// "Super kernels"). During a capture the tasks recorded between a scope's begin and its end form the scope; after
// the capture, super_kernel_optimize replaces each scope's tasks by one FusedTask: one launch at replay, running the
// same kernels over the same bytes in an order that keeps every dependency, so results are identical.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <sstream>
#include <unordered_map>

#include "graph/graph_internal.h"
#include "npu_tensor.h"

namespace npudist::graph {

namespace {

std::string scope_label(const std::optional<std::string>& name) { return name ? "'" + *name + "'" : "None"; }

std::string open_names(const std::vector<std::optional<std::string>>& names) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + scope_label(names[i]);
  return s + "]";
}

// The bytes a task reads and writes (by the data pointer of the CPU storage its aliases use: distinct npu
// storages never share bytes), and whether it must run alone (an ExternalEvent node: it orders other streams
// against everything before and after it) or draws random numbers (the npu generator is advanced in order).
struct Footprint {
  std::unordered_map<const void*, bool> bytes;  // data pointer -> written
  bool barrier = false;
  bool random = false;
};

void touch(Footprint& f, const at::Tensor& t, bool write) {
  if (!t.defined() || !t.has_storage()) return;
  bool& w = f.bytes[t.storage().data_ptr().get()];
  w = w || write;
}

Footprint footprint_of(const RecordedTask& task) {
  Footprint f;
  if (auto* op = dynamic_cast<const OpTask*>(&task)) {
    const auto& schema = op->op.schema().arguments();
    for (size_t j = 0; j < op->args.size(); ++j) {
      const c10::AliasInfo* alias = j < schema.size() ? schema[j].alias_info() : nullptr;
      const bool write = alias && alias->isWrite();
      const c10::IValue& v = op->args[j];
      if (v.isTensor()) touch(f, v.toTensor(), write);
      if (v.isList()) {
        for (const c10::IValue& e : v.toListRef()) {
          if (e.isTensor()) touch(f, e.toTensor(), write);
        }
      }
    }
    for (const StaticOutput& o : op->outputs) touch(f, o.alias, true);
    f.random = op->generator_slot >= 0;
  } else if (auto* copy = dynamic_cast<const CopyTask*>(&task)) {
    touch(f, copy->src, false);
    touch(f, copy->dst, true);
  } else {
    f.barrier = true;
  }
  return f;
}

// Splits `tasks` into waves: a task joins the current wave unless it conflicts with a task in it (both touch the
// same bytes and one writes them, both are random, or either is a barrier). Waves run in order, so every
// read-after-write, write-after-read and write-after-write pair keeps its order.
std::vector<size_t> waves_of(const TaskList& tasks, bool sync_all) {
  std::vector<size_t> starts;
  Footprint wave;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const Footprint f = footprint_of(*tasks[i]);
    bool conflict = sync_all || starts.empty() || f.barrier || wave.barrier || (f.random && wave.random);
    for (auto it = f.bytes.begin(); !conflict && it != f.bytes.end(); ++it) {
      auto w = wave.bytes.find(it->first);
      conflict = w != wave.bytes.end() && (w->second || it->second);
    }
    if (conflict) {
      starts.push_back(i);
      wave = Footprint{};
    }
    for (const auto& [data, write] : f.bytes) {
      bool& w = wave.bytes[data];
      w = w || write;
    }
    wave.barrier = wave.barrier || f.barrier;
    wave.random = wave.random || f.random;
  }
  return starts;
}

[[noreturn]] void raise_subkernel(const FusedTask& fused, size_t k, const std::string& what) {
  TORCH_CHECK(false, "super kernel of scope ", fused.scope, ": sub-kernel ", k, " (", fused.subtasks[k]->describe(),
              ") failed: ", what);
}

}  // namespace

size_t FusedTask::num_leaves() const {
  size_t n = 0;
  for (const auto& t : subtasks) n += t->num_leaves();
  return n;
}

void FusedTask::reserve_leaves(std::vector<std::optional<at::Generator>>& out) {
  for (const auto& t : subtasks) t->reserve_leaves(out);
}

void FusedTask::run(const at::Generator* forked) {
  TORCH_INTERNAL_ASSERT(!forked, "a fused task takes its random streams per sub-kernel (run_leaves)");
  run_leaves(nullptr);
}

void FusedTask::run_leaves(const std::optional<at::Generator>* forks) {
  std::vector<const std::optional<at::Generator>*> sub_forks(subtasks.size(), nullptr);
  if (forks) {
    size_t leaf = 0;
    for (size_t k = 0; k < subtasks.size(); ++k) {
      sub_forks[k] = forks + leaf;
      leaf += subtasks[k]->num_leaves();
    }
  }
  for (size_t w = 0; w < wave_starts.size(); ++w) {
    const size_t begin = wave_starts[w];
    const size_t end = w + 1 < wave_starts.size() ? wave_starts[w + 1] : subtasks.size();
    // The wave's first sub-kernel runs on this thread, the others on the inter-op pool (at::launch carries this
    // thread's dispatch state: below autograd, Python keys excluded). The join below is the synchronization
    // between waves; a failure is raised after the join, for the lowest failing sub-kernel.
    std::mutex mu;
    std::condition_variable cv;
    size_t pending = end - begin - 1;
    std::vector<std::exception_ptr> errors(end - begin);
    for (size_t k = begin + 1; k < end; ++k) {
      at::launch([&, k] {
        try {
          subtasks[k]->run_leaves(sub_forks[k]);
        } catch (...) {
          errors[k - begin] = std::current_exception();
        }
        std::lock_guard<std::mutex> g(mu);
        if (--pending == 0) cv.notify_all();
      });
    }
    try {
      subtasks[begin]->run_leaves(sub_forks[begin]);
    } catch (...) {
      errors[0] = std::current_exception();
    }
    {
      std::unique_lock<std::mutex> g(mu);
      cv.wait(g, [&] { return pending == 0; });
    }
    for (size_t k = begin; k < end; ++k) {
      if (!errors[k - begin]) continue;
      try {
        std::rethrow_exception(errors[k - begin]);
      } catch (const c10::Error& e) {
        raise_subkernel(*this, k, e.what_without_backtrace());
      } catch (const std::exception& e) {
        raise_subkernel(*this, k, e.what());
      }
    }
  }
}

std::string FusedTask::describe() const {
  std::ostringstream os;
  os << "super kernel of scope " << scope << ": " << subtasks.size() << " sub-kernels, " << wave_starts.size()
     << " waves (joined between waves)";
  size_t w = 0;
  for (size_t k = 0; k < subtasks.size(); ++k) {
    if (w < wave_starts.size() && wave_starts[w] == k) os << "\n      wave " << w++ << ":";
    std::string sub = subtasks[k]->describe();
    for (size_t p = sub.find('\n'); p != std::string::npos; p = sub.find('\n', p + 1)) sub.insert(p + 1, "    ");
    os << "\n        (" << k << ") " << sub;
  }
  return os.str();
}

// ------------------------------------------------------------------------------------------------
// Scopes during capture
// ------------------------------------------------------------------------------------------------
void Graph::scope_begin(const std::optional<std::string>& name) {
  std::lock_guard<std::mutex> g(mu_);
  if (state_ != State::kCapturing) return;
  open_scopes_.push_back(Scope{name, tasks_.size(), 0});
}

void Graph::scope_end(const std::optional<std::string>& name) {
  std::lock_guard<std::mutex> g(mu_);
  if (state_ != State::kCapturing) return;
  // Paired by name, the earliest open scope of that name first (torchair's pairing rule).
  for (auto it = open_scopes_.begin(); it != open_scopes_.end(); ++it) {
    if (it->name == name) {
      scopes_.push_back(Scope{name, it->begin, tasks_.size()});
      open_scopes_.erase(it);
      return;
    }
  }
  if (!invalid_.empty()) return;
  std::vector<std::optional<std::string>> names;
  for (const Scope& s : open_scopes_) names.push_back(s.name);
  invalid_ = c10::str("super_kernel_scope_end(scope_name=", scope_label(name), ") has no matching "
                      "super_kernel_scope_begin on this capture; the scopes begun and not yet ended are ",
                      open_names(names), ". Call torch.npu.super_kernel_scope_begin with the same scope_name "
                      "before it, on the capturing stream.");
}

std::string Graph::unclosed_scopes_locked() const {
  if (open_scopes_.empty()) return "";
  std::vector<std::optional<std::string>> names;
  for (const Scope& s : open_scopes_) names.push_back(s.name);
  return c10::str("super_kernel_scope_begin was called without a matching super_kernel_scope_end for scope_name(s) ",
                  open_names(names), ". End every scope (super_kernel_scope_end with the same scope_name) on the "
                  "capturing stream before capture_end.");
}

// ------------------------------------------------------------------------------------------------
// Fusion
// ------------------------------------------------------------------------------------------------
void Graph::super_kernel_optimize(bool sync_all, bool fuse_event_waits) {
  std::lock_guard<std::mutex> g(mu_);
  TORCH_CHECK(state_ == State::kCaptured,
              "Called NPUGraph::super_kernel_optimize without a preceding successful capture.");
  TORCH_CHECK(!update_, "NPUGraph.super_kernel_optimize: a task-group update of this graph is in progress; call "
              "graph_task_update_end first");
  TORCH_CHECK(!super_kernel_optimized_, "NPUGraph.super_kernel_optimize: the graph's scopes were already fused; "
              "reset() and capture it again to fuse with other options");
  const size_t n = tasks_.size();
  // Scopes that overlap or nest are fused together (a task belongs to one launch).
  std::vector<Scope> ranges = scopes_;
  std::sort(ranges.begin(), ranges.end(), [](const Scope& a, const Scope& b) { return a.begin < b.begin; });
  std::vector<Scope> merged;
  for (const Scope& s : ranges) {
    if (s.begin == s.end) continue;
    if (!merged.empty() && s.begin < merged.back().end) {
      merged.back().end = std::max(merged.back().end, s.end);
      continue;
    }
    merged.push_back(s);
  }
  // Task-group tasks stay their own launches (an update replaces them one by one), and a group's boundaries
  // stay task boundaries. An ExternalEvent wait ends a super kernel unless event_breaker_bypass fuses it.
  std::vector<bool> in_group(n, false), cut(n + 1, false);
  for (const Group& grp : groups_) {
    for (size_t i = grp.begin; i < grp.end; ++i) in_group[i] = true;
    cut[grp.begin] = cut[grp.end] = true;
  }
  auto breaks = [&](size_t i) {
    if (in_group[i]) return true;
    auto* ev = dynamic_cast<const ExternalEventTask*>(tasks_[i].get());
    return ev && ev->kind == ExternalEventTask::Kind::kWait && !fuse_event_waits;
  };
  TaskList fused;
  std::vector<size_t> new_index(n + 1, 0);  // old task index -> index of the new task that starts there
  size_t i = 0;
  auto keep = [&](size_t from, size_t to, const std::optional<std::string>& name) {  // tasks_[from, to) -> one
    new_index[from] = fused.size();
    if (to - from == 1) {
      fused.push_back(tasks_[from]);
      return;
    }
    auto task = std::make_shared<FusedTask>();
    task->scope = scope_label(name);
    task->subtasks.assign(tasks_.begin() + from, tasks_.begin() + to);
    task->wave_starts = waves_of(task->subtasks, sync_all);
    std::unordered_map<c10::StorageImpl*, bool> seen;
    for (const auto& sub : task->subtasks) {
      for (const auto& si : sub->storages) {
        if (seen.emplace(si.get(), true).second) task->storages.push_back(si);
      }
    }
    fused.push_back(std::move(task));
  };
  for (const Scope& s : merged) {
    for (; i < s.begin; ++i) keep(i, i + 1, std::nullopt);
    while (i < s.end) {
      if (breaks(i)) {
        keep(i, i + 1, std::nullopt);
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < s.end && !breaks(j) && !cut[j]) ++j;
      keep(i, j, s.name);
      i = j;
    }
  }
  for (; i < n; ++i) keep(i, i + 1, std::nullopt);
  new_index[n] = fused.size();
  for (Group& grp : groups_) {
    grp.begin = new_index[grp.begin];
    grp.end = new_index[grp.end];
  }
  tasks_ = std::move(fused);
  scopes_.clear();
  super_kernel_optimized_ = true;
}

// ------------------------------------------------------------------------------------------------
// Python
// ------------------------------------------------------------------------------------------------
void init_super_kernel_bindings(pybind11::module_& m) {
  // The scope ops act on the calling thread's current stream of the current device: a mark in the capture it
  // records into, nothing when it is not capturing (an update stream's re-issued ops have no scopes).
  m.def("_super_kernel_scope", [](bool begin, const std::optional<std::string>& name) {
    TORCH_CHECK(!name || name->find_first_not_of(" \t\n\r\f\v") != std::string::npos,
                "scope_name should be None or a non-empty string.");
    int device = rt::current_device();
    Graph* graph = graph_on_stream(device, rt::api().get_stream(device));
    if (!graph || graph->updating()) return;
    if (begin) graph->scope_begin(name);
    else graph->scope_end(name);
  }, pybind11::arg("begin"), pybind11::arg("scope_name"));
}

}  // namespace npudist::graph
