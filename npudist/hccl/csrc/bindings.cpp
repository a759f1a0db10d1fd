// Python module npudist.hccl._C: ProcessGroupHCCL (a torch Backend subclass), its Options, the
// flight-recorder dump, and the device runtime table handed over from Python.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "flight_recorder_dump.h"
#include "internal.h"
#include "npudist/runtime_c_api.h"
#include "process_group_hccl.h"
#include "profiling.h"

namespace py = pybind11;

namespace npudist::hccl {

namespace {

const char* const kConfigKeys = "hccl_buffer_size (MB), hccl_exec_timeout (s), hccl_connect_timeout (s)";

int64_t seconds(std::chrono::milliseconds t) {
  return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::seconds>(t).count());
}

// The keys set (0: not set, the environment decides), as torch_npu's hccl_config reads back.
py::dict get_config(const HCCLOptions& o) {
  py::dict d;
  d["hccl_buffer_size"] = static_cast<int64_t>(o.buffer_bytes >> 20);
  d["hccl_exec_timeout"] = seconds(o.exec_timeout);
  d["hccl_connect_timeout"] = seconds(o.connect_timeout);
  return d;
}

int64_t positive_int(const py::handle& v, const std::string& key) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
    throw py::value_error("hccl_config['" + key + "'] must be an int, got " +
                          std::string(py::str(v.get_type().attr("__name__"))));
  }
  int64_t x = v.cast<int64_t>();
  if (x <= 0) throw py::value_error("hccl_config['" + key + "'] must be positive, got " + std::to_string(x));
  return x;
}

void set_config(HCCLOptions& o, const py::dict& d) {
  for (auto item : d) {
    const std::string key = py::str(item.first);
    if (key == "hccl_buffer_size") {
      o.buffer_bytes = static_cast<size_t>(positive_int(item.second, key)) << 20;
    } else if (key == "hccl_exec_timeout") {
      o.exec_timeout = std::chrono::seconds(positive_int(item.second, key));
    } else if (key == "hccl_connect_timeout") {
      o.connect_timeout = std::chrono::seconds(positive_int(item.second, key));
    } else {
      throw py::value_error("unknown hccl_config key '" + key + "'; supported keys: " + kConfigKeys);
    }
  }
}

// `setter(capsule)`: installs the C table of type Table that npudist._C's `getter()` returns as a PyCapsule
// named `name`; any other object is a TypeError naming the capsule expected.
template <class Table>
void def_table_setter(py::module_& m, const char* setter, const char* getter, const char* name,
                      void (*install)(const Table*), const char* doc) {
  m.def(
      setter,
      [=](const py::object& capsule) {
        if (!PyCapsule_IsValid(capsule.ptr(), name)) {
          throw py::type_error(std::string(setter) + ": expected the PyCapsule '" + name +
                               "' returned by npudist._C." + getter + "(), got " +
                               std::string(py::str(capsule.get_type().attr("__name__"))));
        }
        install(static_cast<const Table*>(PyCapsule_GetPointer(capsule.ptr(), name)));
      },
      doc);
}

}  // namespace

}  // namespace npudist::hccl

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace npudist::hccl;
  m.doc() = "npudist hccl backend (ProcessGroupHCCL)";
  // Registers c10d::Backend and c10d::Store with pybind11 before we derive from / accept them.
  py::module_::import("torch.distributed");

  auto pg = py::class_<ProcessGroupHCCL, c10d::Backend, c10::intrusive_ptr<ProcessGroupHCCL>>(
      m, "ProcessGroupHCCL");

  py::class_<HCCLOptions, c10d::Backend::Options, c10::intrusive_ptr<HCCLOptions>>(pg, "Options")
      .def(py::init([](std::chrono::milliseconds timeout) {
             return c10::make_intrusive<HCCLOptions>(timeout);
           }),
           py::arg("timeout") = kBackendDefaultTimeout)
      .def_property(
          "hccl_config", [](const HCCLOptions& o) { return get_config(o); },
          [](HCCLOptions& o, const py::dict& d) { set_config(o, d); },
          "Backend settings (torch_npu's keys): hccl_buffer_size (MB; the communicator holds 2 x it on each npu "
          "device it uses; default HCCL_BUFFSIZE, 200), hccl_exec_timeout (s; this group's op timeout, default "
          "HCCL_EXEC_TIMEOUT), hccl_connect_timeout (s; default HCCL_CONNECT_TIMEOUT, 120).")
      .def_readwrite("_timeout_from_user", &HCCLOptions::timeout_from_user)
      .def_readwrite("group_desc", &HCCLOptions::group_desc)
      .def("__copy__", [](const HCCLOptions& o) { return c10::make_intrusive<HCCLOptions>(o); })
      .def("__deepcopy__",
           [](const HCCLOptions& o, const py::dict&) { return c10::make_intrusive<HCCLOptions>(o); });

  pg.def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     c10::intrusive_ptr<HCCLOptions> options) {
           if (!options) options = c10::make_intrusive<HCCLOptions>();
           return c10::make_intrusive<ProcessGroupHCCL>(store, rank, size, options);
         }),
         py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("options") = nullptr)
      .def_property_readonly("options", [](ProcessGroupHCCL& p) {
        return c10::static_intrusive_pointer_cast<HCCLOptions>(p.getBackendOptions());
      })
      .def_property_readonly("comm_name", &ProcessGroupHCCL::comm_name)
      .def_property_readonly("zero_copy_ops", &ProcessGroupHCCL::zero_copy_ops)
      .def_property_readonly("num_nodes", [](ProcessGroupHCCL& p) { return p.topology().num_nodes(); })
      .def_property_readonly("node_index", [](ProcessGroupHCCL& p) { return p.topology().node; })
      .def_property_readonly("local_rank", [](ProcessGroupHCCL& p) { return p.topology().local_rank; })
      .def_property_readonly("local_size", [](ProcessGroupHCCL& p) { return p.topology().local_size(); })
      .def_property_readonly("timeout", &ProcessGroupHCCL::timeout)
      .def_property_readonly("buffer_bytes", &ProcessGroupHCCL::buffer_bytes)
      .def_property_readonly("staging_bytes", &ProcessGroupHCCL::staging_bytes)
      .def_property_readonly("device_buffer_bytes", &ProcessGroupHCCL::device_buffer_bytes)
      .def_property_readonly("charged_devices", &ProcessGroupHCCL::charged_devices)
      .def_property_readonly("deterministic", &ProcessGroupHCCL::deterministic)
      .def_property_readonly("uses_gloo", [](ProcessGroupHCCL& p) { return p.communicator_kind() != "shm"; })
      .def_property_readonly("communicator", &ProcessGroupHCCL::communicator_kind)
      // torch calls this on ranks outside a new_group when the default group has a bound device
      // (NCCL must then join ncclCommSplit). hccl communicators involve only the members: no-op.
      .def("perform_nocolor_split", [](ProcessGroupHCCL&, const c10::Device&) {})
      .def("comm_split_count", [](ProcessGroupHCCL&) { return 0; })
      // torch_npu's name (ProcessGroupHCCL::abortAndClearHcclComm), what reinit_process_group calls.
      .def(
          "abort_hccl_comm",
          [](ProcessGroupHCCL& p, const std::optional<std::string>& reason) {
            p.abort_and_clear_comm(reason.value_or(""));
          },
          py::arg("reason") = py::none(), py::call_guard<py::gil_scoped_release>(),
          "Abort the group's communicator (pending ops, here and on the node's peers, fail naming the reason), "
          "drain them and drop it; the group's next op builds a new one with the other ranks, which must do the "
          "same (torch_npu.distributed.reinit_process_group).")
      .def_property_readonly("comm_generation", &ProcessGroupHCCL::generation,
                             "How many communicators abort_hccl_comm replaced (0: the group's first).");

  def_table_setter<NpudistRuntimeApi>(m, "_set_runtime_api", "_runtime_api", NPUDIST_RUNTIME_API_CAPSULE,
                                      &set_runtime_api, "Install the device runtime's C table.");
  def_table_setter<NpudistLaunchApi>(m, "_set_launch_api", "_launch_api", NPUDIST_LAUNCH_API_CAPSULE, &set_launch_api,
                                     "Install npudist._C's launch table.");
  def_table_setter<NpudistProfilerApi>(m, "_set_profiler_api", "_profiler_api", NPUDIST_PROFILER_API_CAPSULE,
                                       &profiling::set_api, "Install npudist._C's device profiler table.");
  m.def(
      "_dump_trace",
      [](int global_rank, const std::string& reason) { return py::bytes(dump_pickle(global_rank, reason)); },
      py::arg("global_rank"), py::arg("reason") = "on demand",
      "The flight recorder of every hccl group of this process, pickled in PyTorch's dump format.");
  m.def(
      "_dump_trace_file", [](int global_rank, const std::string& reason) { return dump_to_file(global_rank, reason); },
      py::arg("global_rank"), py::arg("reason") = "on demand");
}
