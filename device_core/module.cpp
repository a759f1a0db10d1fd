// npudist._C: registers the npu device's C++ pieces with PyTorch and exposes the runtime to Python.
#include <torch/csrc/Generator.h>
#include <torch/extension.h>

#include <chrono>
#include <thread>

#include "allocator/npu_allocator.h"
#include "npu_tensor.h"
#include "profiler.h"

namespace npudist {
void register_hooks();  // hooks.cpp
double event_elapsed_ms(void* start, void* end);  // guard.cpp

namespace {

namespace rt = runtime;

void check_index(int device) {
  int n = rt::device_count();
  TORCH_CHECK_VALUE(device >= 0 && device < n, "Invalid npu device index ", device, ": this process sees ", n,
                    " npu device(s) (set by NPUDIST_DEVICE_COUNT and ASCEND_RT_VISIBLE_DEVICES)");
}

// A host function that sleeps, then fills a tensor: stands in for asynchronous device work (what a
// collective does) so that stream/event ordering can be observed from Python.
// The task holds only raw bytes: the block stays valid through record_stream, and destroying a tensor
// on the stream worker could need the Python GIL.
struct FillTask {
  void* data;
  int64_t numel;
  at::ScalarType dtype;
  double value;
  int64_t delay_us;
};

void run_fill(void* p) {
  std::unique_ptr<FillTask> t(static_cast<FillTask*>(p));
  std::this_thread::sleep_for(std::chrono::microseconds(t->delay_us));
  at::from_blob(t->data, {t->numel}, at::TensorOptions().dtype(t->dtype)).fill_(t->value);
}

void* release_gil_if_held() {
  if (Py_IsInitialized() && PyGILState_Check()) return PyEval_SaveThread();
  return nullptr;
}
void restore_gil(void* token) {
  if (token) PyEval_RestoreThread(static_cast<PyThreadState*>(token));
}

void launch_fill(const at::Tensor& target, double value, int64_t delay_us, int64_t stream) {
  TORCH_CHECK_VALUE(target.device().type() == kNpu && target.is_contiguous(),
                    "_launch_host_fill: expected a contiguous npu tensor");
  TORCH_CHECK_VALUE(delay_us >= 0, "_launch_host_fill: delay must be >= 0");
  int dev = target.device().index();
  rt::check_stream(stream);
  memory::record_stream(target.storage().data_ptr(),
                        c10::Stream(c10::Stream::UNSAFE, target.device(), stream));
  rt::launch_host_func(dev, stream, &run_fill,
                       new FillTask{target.data_ptr(), target.numel(), target.scalar_type(), value, delay_us});
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
  rt::set_blocking_hooks({&release_gil_if_held, &restore_gil});
  memory::init_bindings(m);
  profiler::init_bindings(m);

  m.attr("_num_cpu_kernel_redirects") = redirected;
  auto nogil = py::call_guard<py::gil_scoped_release>();
  // Called by npudist.device at import so a malformed NPUDIST_* / ASCEND_RT_VISIBLE_DEVICES is a ValueError
  // (an exception thrown during module init would surface as an ImportError).
  m.def("_validate_config", &rt::validate_config);
  m.def("_device_count", &rt::device_count);
  m.def("_current_device", &rt::current_device);
  m.def("_set_device", [](int d) { check_index(d); rt::set_current_device(d); });
  m.def("_physical_device", [](int d) { check_index(d); return rt::physical_device(d); });
  m.def("_device_capacity", [](int d) { check_index(d); return rt::device_capacity(d); });
  m.def("_parse_size", [](const std::string& s) { return rt::parse_size(s, "size"); });
  m.def("_is_initialized", &rt::is_initialized);
  m.def("_mark_initialized", &rt::mark_initialized);
  m.def("_synchronize", [](int d) { check_index(d); rt::device_synchronize(d); }, nogil);
  m.def("_current_stream", [](int d) { check_index(d); return rt::current_stream(d); });
  m.def("_set_stream", [](int d, int64_t s) {
    check_index(d);
    rt::set_current_stream(d, s);
  });
  m.def("_stream_query", [](int d, int64_t s) { check_index(d); return rt::stream_query(d, s); });
  m.def("_stream_synchronize", [](int d, int64_t s) { check_index(d); rt::stream_synchronize(d, s); }, nogil);
  m.def("_stream_priority", &rt::stream_priority);
  m.def("_default_generator", [](int d) {
    check_index(d);
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_npu_generator(d)));
  });
  m.def("_event_elapsed_ms", [](uintptr_t start, uintptr_t end) {
    return event_elapsed_ms(reinterpret_cast<void*>(start), reinterpret_cast<void*>(end));
  }, "Milliseconds between two recorded npu events given their event_id values.");
  m.def("_runtime_api", [] { return reinterpret_cast<uintptr_t>(rt::c_api()); },
        "Address of the static NpudistRuntimeApi table (runtime_c_api.h) for npudist.hccl._C.");
  m.def("_launch_host_fill", &launch_fill, py::arg("target"), py::arg("value"), py::arg("delay_us"),
        py::arg("stream"),
        "Enqueue on `stream` of target's device a host function that sleeps delay_us, then fills target.");
  m.def("_cpu_alias", [](const at::Tensor& t) {
    TORCH_CHECK_VALUE(t.device().type() == kNpu, "_cpu_alias: expected an npu tensor");
    return cpu_alias(t);
  }, "The CPU view over an npu tensor's bytes that the zero-copy fallback hands to CPU kernels.");
}
