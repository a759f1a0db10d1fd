// torch.npu.ExternalEvent (graph_internal.h, docs/graph_task_update.md): an event a stream may wait on before
// it is recorded. record() sets its flag, reset() clears it, wait() holds the stream until the flag is set. Issued
// on a capturing stream, each call becomes a node of the graph that every replay runs; elsewhere it runs in its
// stream's order (queued behind the stream's work, or at once when launches are synchronous).
#include <torch/extension.h>

#include "graph/graph_internal.h"
#include "launch/launch.h"
#include "npu_tensor.h"

namespace npudist::graph {

thread_local bool t_in_queued_replay = false;

void ExternalEventState::record() {
  {
    std::lock_guard<std::mutex> g(mu);
    recorded = true;
  }
  cv.notify_all();
}

void ExternalEventState::reset() {
  std::lock_guard<std::mutex> g(mu);
  recorded = false;
}

void ExternalEventState::wait(bool may_block, const char* what) {
  std::unique_lock<std::mutex> g(mu);
  if (recorded) return;
  TORCH_CHECK(may_block, what, ": the ExternalEvent has not been recorded, and this wait runs on the thread that "
              "would have to record it (synchronous launch: ASCEND_LAUNCH_BLOCKING=1, task-queue level 0, or an "
              "NPUGraph capture or profiler in progress), so it would block forever. Record the event (e.g. on the "
              "update stream after graph_task_update_end) before the wait runs.");
  cv.wait(g, [this] { return recorded; });
}

using Kind = ExternalEventTask::Kind;

static const char* kind_name(Kind k) {
  return k == Kind::kRecord ? "ExternalEvent.record" : k == Kind::kWait ? "ExternalEvent.wait" : "ExternalEvent.reset";
}

static void run_kind(ExternalEventState& ev, Kind kind, bool may_block, const char* what) {
  if (kind == Kind::kRecord) ev.record();
  else if (kind == Kind::kReset) ev.reset();
  else ev.wait(may_block, what);
}

void ExternalEventTask::run(const at::Generator*) {
  run_kind(*event, kind, t_in_queued_replay, "NPUGraph replay: ExternalEvent.wait()");
}

std::string ExternalEventTask::name() const { return kind_name(kind); }

namespace {

struct ExternalEvent {
  std::shared_ptr<ExternalEventState> state = std::make_shared<ExternalEventState>();

  void issue(Kind kind, int device, int64_t stream) {
    Graph* graph = graph_on_stream(device, stream);
    if (graph && !graph->updating()) {
      // A node of the captured graph: it runs on each replay, not now (as a device graph's event node).
      graph->add_task(std::make_unique<ExternalEventTask>(state, kind), {});
      return;
    }
    if (!launch::may_queue()) {
      run_kind(*state, kind, false, kind_name(kind));
      return;
    }
    // In the stream's order: queued behind the work already issued there. The stream's worker may block in a
    // wait until another stream's worker records the event.
    const int64_t prev = rt::api().get_stream(device);
    rt::check(rt::api().set_stream(device, stream));
    try {
      launch::enqueue(device, kind_name(kind), [ev = state, kind] { run_kind(*ev, kind, true, kind_name(kind)); });
    } catch (...) {
      (void)rt::api().set_stream(device, prev);
      throw;
    }
    rt::check(rt::api().set_stream(device, prev));
  }
};

}  // namespace

void init_external_event_bindings(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<ExternalEvent>(m, "_ExternalEvent")
      .def(py::init<>())
      .def("record", [](ExternalEvent& e, int device, int64_t stream) { e.issue(Kind::kRecord, device, stream); },
           py::call_guard<py::gil_scoped_release>())
      .def("wait", [](ExternalEvent& e, int device, int64_t stream) { e.issue(Kind::kWait, device, stream); },
           py::call_guard<py::gil_scoped_release>())
      .def("reset", [](ExternalEvent& e, int device, int64_t stream) { e.issue(Kind::kReset, device, stream); },
           py::call_guard<py::gil_scoped_release>())
      .def("query", [](ExternalEvent& e) {
        std::lock_guard<std::mutex> g(e.state->mu);
        return e.state->recorded;
      });
}

}  // namespace npudist::graph
