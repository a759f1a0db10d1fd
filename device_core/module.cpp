// npudist._C: registers the npu device's C++ pieces with PyTorch and exposes the runtime to Python.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include <frameobject.h>

#include "allocator/npu_allocator.h"
#include "graph/graph_capture.h"
#include "launch/launch.h"
#include "op_path/op_path.h"
#include "npu_tensor.h"
#include "profiler/profiler.h"

namespace npudist {
void register_hooks();  // hooks.cpp
double event_elapsed_ms(void* start, void* end);  // guard.cpp

namespace {

void check_index(int device) {
  int n = rt::device_count();
  TORCH_CHECK_VALUE(device >= 0 && device < n, "Invalid npu device index ", device, ": this process sees ", n,
                    " npu device(s) (set by NPUDIST_DEVICE_COUNT and ASCEND_RT_VISIBLE_DEVICES)");
}

void* release_gil_if_held() {
  if (Py_IsInitialized() && PyGILState_Check()) return PyEval_SaveThread();
  return nullptr;
}
void restore_gil(void* token) {
  if (token) PyEval_RestoreThread(static_cast<PyThreadState*>(token));
}

// Launch sites of npu ops, for errors of queued kernels. At launch only the innermost Python frame's code
// object and instruction offset are taken (the line number is computed from them only when a kernel
// failed). Ops called from Python run with the GIL released, so capturing takes it back briefly; threads
// without Python (the autograd engine's device threads) have no site. Tokens are released on stream
// workers, which hold no GIL: their code references are dropped at the next capture, which holds it.
struct PySite {
  PyCodeObject* code;
  int lasti;
};
std::mutex g_released_mu;
std::vector<PySite*> g_released;

void* capture_site() {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return nullptr;
  PyGILState_STATE g = PyGILState_Ensure();
  PySite* site = nullptr;
  if (PyFrameObject* f = PyEval_GetFrame()) site = new PySite{PyFrame_GetCode(f), PyFrame_GetLasti(f)};
  std::vector<PySite*> done;
  {
    std::lock_guard<std::mutex> lk(g_released_mu);
    done.swap(g_released);
  }
  for (PySite* s : done) {
    Py_DECREF(s->code);
    delete s;
  }
  PyGILState_Release(g);
  return site;
}

std::string describe_site(void* token) {
  auto* site = static_cast<PySite*>(token);
  if (!Py_IsInitialized()) return {};
  PyGILState_STATE g = PyGILState_Ensure();
  const char* file = PyUnicode_AsUTF8(site->code->co_filename);
  std::string out = std::string(file ? file : "?") + ":" + std::to_string(PyCode_Addr2Line(site->code, site->lasti));
  if (PyErr_Occurred()) PyErr_Clear();
  PyGILState_Release(g);
  return out;
}

void release_site(void* token) {
  std::lock_guard<std::mutex> lk(g_released_mu);
  g_released.push_back(static_cast<PySite*>(token));
}

py::tuple device_properties(int d) {
  check_index(d);
  NpudistDeviceProperties p{};
  rt::check(rt::api().get_device_properties(d, &p));
  return py::make_tuple(std::string(p.name), p.total_memory, p.physical_index);
}

}  // namespace
}  // namespace npudist

PYBIND11_MODULE(_C, m) {
  using namespace npudist;
  m.doc() = "npudist device core: the emulated npu device (PrivateUse1)";
  c10::SetAllocator(kNpu, memory::allocator());
  install_cpu_allocator_wrapper();
  register_hooks();
  size_t redirected = register_cpu_kernel_redirects();
  rt::api().set_blocking_hooks(&release_gil_if_held, &restore_gil);
  launch::set_site_hooks(
      launch::SiteHooks{&capture_site, &describe_site, &release_site, &release_gil_if_held, &restore_gil});
  memory::init_bindings(m);
  profiler::init_bindings(m);
  graph::init_bindings(m);

  m.attr("_num_cpu_kernel_redirects") = redirected;
  // Called by npudist.device at import so a malformed NPUDIST_* / ASCEND_RT_VISIBLE_DEVICES is a ValueError
  // (an exception thrown during module init would surface as an ImportError).
  m.def("_validate_config", [] {
    rt::check(rt::api().validate_config());
    launch::queue_depth();  // NPUDIST_LAUNCH_QUEUE_DEPTH
  });
  m.def("_device_count", [] { return rt::device_count(); });
  m.def("_current_device", [] { return rt::current_device(); });
  m.def("_set_device", [](int d) { check_index(d); rt::set_device(d); });
  m.def("_device_properties", &device_properties, "(name, total_memory, physical_index) of a device.");
  m.def("_is_initialized", [] { return rt::api().is_initialized() != 0; });
  m.def("_mark_initialized", [] { rt::api().mark_initialized(); });
  // Synchronization points raise the warnings of queued kernels (launch::after_sync): torch's warning handler
  // makes them Python warnings (wrap_pybind_function), as for any torch binding; the GIL is released inside.
  m.def("_synchronize", torch::wrap_pybind_function_no_gil([](int d) {
    check_index(d);
    if (graph::any_capture_active()) graph::check_not_capturing("torch.npu.synchronize()");
    rt::check(rt::api().device_synchronize(d));
    launch::after_sync();
  }));
  m.def("_launch_blocking", [] { return launch::blocking(); },
        "True when ASCEND_LAUNCH_BLOCKING/NPUDIST_LAUNCH_BLOCKING made every npu op synchronous.");
  m.def("_task_queue_level", [] { return launch::task_queue_level(); });
  m.def("_set_task_queue_level", [](int level) { launch::set_task_queue_level(level); });
  m.def("_launch_counts", [] {
    launch::Counts c = launch::counts();
    return py::dict(py::arg("queued") = c.queued, py::arg("synchronous") = c.synchronous,
                    py::arg("metadata") = c.metadata, py::arg("inline") = c.ran_inline);
  }, "Ops by launch path since the last reset: queued kernels, synchronous (drained) ops, metadata ops, "
     "kernels run inline on an idle stream.");
  m.def("_reset_launch_counts", [] { launch::reset_counts(); });
  m.def("_op_out_overload", [](const std::string& name, const std::string& overload) -> std::optional<std::string> {
    auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(name, overload));
    if (!op) throw std::invalid_argument("no operator " + name + "." + overload);
    auto out = op_path::find_out_overload(*op);
    return out ? std::optional<std::string>(out->schema().overload_name()) : std::nullopt;
  }, "The out= overload a queued call of the op may write its outputs through (docs/op_path.md), or None.");
  m.def("_in_meta_inference", &op_path::in_meta_inference,
        "True while the calling thread runs an op's Meta kernel to infer its outputs (docs/op_path.md).");
  m.def("_set_thread_inline_launch", [](bool enable) { return launch::c_api()->set_thread_inline(enable) != 0; },
        "Make npu ops of the calling thread run inline (no queue, no drain); returns the previous setting.");
  m.def("_launch_api", [] {
          return py::capsule(static_cast<const void*>(launch::c_api()), NPUDIST_LAUNCH_API_CAPSULE);
        },
        "The launch C table (NpudistLaunchApi, npudist/launch_c_api.h) as a PyCapsule named "
        "NPUDIST_LAUNCH_API_CAPSULE, for npudist.hccl._C.");
  m.def("_current_stream", [](int d) { check_index(d); return rt::api().get_stream(d); });
  m.def("_set_stream", [](int d, int64_t s) {
    check_index(d);
    rt::check(rt::api().set_stream(d, s));
  });
  m.def("_stream_query", [](int d, int64_t s) {
    check_index(d);
    int idle = rt::api().stream_query(d, s);
    if (idle < 0) throw std::out_of_range(rt::api().last_error());
    return idle != 0;
  });
  m.def("_stream_synchronize", torch::wrap_pybind_function_no_gil([](int d, int64_t s) {
    check_index(d);
    if (graph::any_capture_active()) graph::check_not_capturing("Stream.synchronize()");
    rt::check(rt::api().stream_synchronize(d, s));
    launch::after_sync();
  }));
  m.def("_stream_priority", [](int64_t s) { return rt::api().stream_priority(s); });
  m.attr("_SYNC_LAUNCH_STREAM_IDS") = py::make_tuple(NPUDIST_SYNC_LAUNCH_STREAM_FIRST, NPUDIST_SYNC_LAUNCH_STREAMS);
  m.attr("_GRAPH_CAPTURE_STREAM") = NPUDIST_GRAPH_CAPTURE_STREAM;
  m.def("_sync_launch_stream", [](int d) { check_index(d); return launch::sync_launch_stream(d); },
        "A stream id of the device's sync-launch pool (torch.npu.SyncLaunchStream; launch.h).");
  m.def("_npu_utilization", [](int d, int64_t window_ns) { check_index(d); return launch::utilization(d, window_ns); },
        py::arg("device"), py::arg("window_ns") = launch::kUtilizationWindowNs,
        "Percent of the past window_ns during which a kernel of the device ran (torch.npu.utilization).");
  m.def("_default_generator", [](int d) {
    check_index(d);
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_npu_generator(d)));
  });
  m.def("_event_elapsed_ms", [](uintptr_t start, uintptr_t end) {
    return event_elapsed_ms(reinterpret_cast<void*>(start), reinterpret_cast<void*>(end));
  }, "Milliseconds between two recorded npu events given their event_id values.");
  m.def("_runtime_api", [] {
    return py::capsule(static_cast<const void*>(rt::api_ptr()), NPUDIST_RUNTIME_API_CAPSULE);
  }, "The device runtime's C table (NpudistRuntimeApi, npudist/runtime_c_api.h) as a PyCapsule named "
     "'" NPUDIST_RUNTIME_API_CAPSULE "', for npudist.hccl._C and other extensions.");
}
