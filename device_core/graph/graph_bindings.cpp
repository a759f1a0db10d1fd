// NPUGraph's Python bindings, and the static input / output copies of torch.compile's npugraphs backend
// (graph_internal.h).
#include <torch/extension.h>

#include "graph/graph_internal.h"
#include "launch/launch.h"
#include "npu_tensor.h"

namespace npudist::graph {

// ------------------------------------------------------------------------------------------------
// Static input / output traffic of torch.compile's npugraphs backend, in one call each (no Python dispatch
// per tensor): new inputs copied into the static inputs, static outputs copied out into fresh tensors.
// ------------------------------------------------------------------------------------------------
namespace {

void copy_into_static(const std::vector<at::Tensor>& statics, const std::vector<at::Tensor>& news) {
  TORCH_CHECK_VALUE(statics.size() == news.size(), "copy_into_static: ", statics.size(), " static inputs but ",
                    news.size(), " new inputs");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  // The copies below read and write npu bytes on this thread: queued work producing the inputs runs first.
  for (const at::Tensor& t : news) {
    if (t.defined() && t.device().type() == kNpu) launch::drain(t.device().index());
  }
  for (size_t i = 0; i < statics.size(); ++i) {
    const at::Tensor& dst = statics[i];
    const at::Tensor& src = news[i];
    if (dst.data_ptr() == src.data_ptr() && dst.strides() == src.strides()) continue;
    TORCH_CHECK_VALUE(dst.sizes() == src.sizes(), "copy_into_static: input ", i, " has shape ", src.sizes(),
                      ", the graph was captured with ", dst.sizes());
    if (dst.device().type() == kNpu && src.device().type() == kNpu) cpu_alias(dst).copy_(cpu_alias(src));
    else dst.copy_(src);
  }
}

std::vector<at::Tensor> copy_out(const std::vector<at::Tensor>& outputs) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  for (const at::Tensor& t : outputs) {
    if (t.defined() && t.device().type() == kNpu) launch::drain(t.device().index());
  }
  std::vector<at::Tensor> fresh;
  fresh.reserve(outputs.size());
  for (const at::Tensor& o : outputs) {
    if (!o.defined() || o.device().type() != kNpu) {
      fresh.push_back(o.defined() ? o.clone() : o);
      continue;
    }
    at::Tensor f = o.is_non_overlapping_and_dense() ? at::empty_strided(o.sizes(), o.strides(), o.options())
                                                    : at::empty(o.sizes(), o.options());
    cpu_alias(f).copy_(cpu_alias(o));
    fresh.push_back(std::move(f));
  }
  return fresh;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Python
// ------------------------------------------------------------------------------------------------
void init_bindings(pybind11::module_& m) {
  namespace py = pybind11;
  auto nogil = py::call_guard<py::gil_scoped_release>();
  py::class_<Graph, std::shared_ptr<Graph>>(m, "_NPUGraph")
      .def(py::init<>())
      .def("capture_begin", &Graph::capture_begin, py::arg("pool") = 0, py::arg("capture_error_mode") = "global")
      .def("capture_end", &Graph::capture_end)
      .def("replay", &Graph::replay, nogil)
      .def("reset", &Graph::reset, nogil)
      .def("pool", &Graph::pool)
      .def("debug_dump", &Graph::debug_dump)
      .def("num_tasks", &Graph::num_tasks)
      .def("num_task_groups", &Graph::num_groups)
      .def("num_super_kernel_scopes", &Graph::num_scopes)
      .def("super_kernel_optimize", &Graph::super_kernel_optimize, py::arg("sync_all"),
           py::arg("fuse_event_waits"), nogil);
  m.def("_graph_copy_into_static", &copy_into_static, nogil,
        "Copy each new input into its static input unless it already is that tensor.");
  m.def("_graph_copy_out", &copy_out, nogil, "Fresh tensors holding copies of the given (static) outputs.");
  m.def("_graph_pool_handle", [] { return g_next_pool.fetch_add(1); });
  m.def("_is_current_stream_capturing", [] { return capturing_graph(rt::current_device()) != nullptr; });
  init_task_group_bindings(m);
  init_external_event_bindings(m);
  init_super_kernel_bindings(m);
}

}  // namespace npudist::graph
