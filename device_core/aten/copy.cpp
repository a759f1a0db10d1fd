// The copy kernels of the npu (aten::_copy_from, _copy_from_and_resize, _local_scalar_dense) and their launch
// policy: a copy between npu tensors of one device, or between an npu tensor and pinned host memory with
// non_blocking, is a queued kernel; other copies and scalar reads touch the bytes after the npu sides' queued
// work, as cudaMemcpy does. Above the CPU aliases (npu_tensor.cpp), launch and graph capture.
#include <ATen/EmptyTensor.h>
#include <torch/library.h>

#include "allocator/host_allocator.h"
#include "graph/graph_capture.h"
#include "launch/launch.h"
#include "npu_tensor.h"
#include "profiler/profiler.h"

namespace npudist {
namespace {
at::Tensor as_cpu(const at::Tensor& t, const char* what) {
  if (t.device().type() == kNpu) return cpu_alias(t);
  TORCH_CHECK(t.device().is_cpu(), "copy between npu and ", t.device(), " is not supported (", what, ")");
  return t;
}
// As as_cpu, for a copy queued on `stream`: the npu side as a kernel queued there sees it (queued_cpu_alias).
at::Tensor as_queued_cpu(const at::Tensor& t, int64_t stream, const char* what) {
  return t.device().type() == kNpu ? queued_cpu_alias(t, stream) : as_cpu(t, what);
}
}  // namespace

// HOST-MEMORY: the CPU copy kernel reads/writes npu bytes; a real device uses aclrtMemcpyAsync (dense) or a copy kernel.
static void copy_through_cpu(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  const bool src_npu = src.device().type() == kNpu, dst_npu = dst.device().type() == kNpu;
  if (src_npu && dst_npu && src.device() == dst.device() && launch::may_queue()) {
    // npu -> npu: a queued kernel, like every other op, seeing both sides as queued kernels do.
    const int device = dst.device().index();
    const int64_t stream = rt::api().get_stream(device);
    at::Tensor src_cpu = queued_cpu_alias(src, stream), dst_cpu = queued_cpu_alias(dst, stream);
    launch::enqueue(device, "aten::copy_", [src_cpu, dst_cpu]() mutable { dst_cpu.copy_(src_cpu); });
    return;
  }
  // A non_blocking copy between an npu tensor and pinned host memory is queued on the npu side's current
  // stream, as cudaMemcpyAsync is: the caller synchronizes (stream, event) before it reads a D2H result or
  // reuses an H2D source, exactly as on CUDA. The closure holds the pinned tensor, so its block is not
  // reused before the copy ran.
  if (non_blocking && src_npu != dst_npu && launch::may_queue()) {
    const at::Tensor& host = src_npu ? dst : src;
    if (host.device().is_cpu() && host.has_storage() && host_memory::is_pinned(host.storage().data())) {
      const int device = (src_npu ? src : dst).device().index();
      const int64_t stream = rt::api().get_stream(device);
      at::Tensor src_cpu = as_queued_cpu(src, stream, "source"), dst_cpu = as_queued_cpu(dst, stream, "destination");
      launch::enqueue(device, "aten::copy_", [src_cpu, dst_cpu]() mutable { dst_cpu.copy_(src_cpu); });
      return;
    }
  }
  // Other host <-> npu (and cross-device) copies touch the bytes now, after the queued work of the npu
  // sides: a D2H copy waits like cudaMemcpy, an H2D copy reads the pageable source before returning (so
  // the caller may reuse it), whether or not non_blocking was asked for.
  launch::count_synchronous();
  if (src_npu) launch::drain(src.device().index());
  if (dst_npu && !(src_npu && src.device() == dst.device())) launch::drain(dst.device().index());
  at::Tensor src_cpu = as_cpu(src, "source");
  at::Tensor dst_cpu = as_cpu(dst, "destination");
  dst_cpu.copy_(src_cpu, non_blocking);
}

// HOST-MEMORY: reads the element in place; a real device copies it to the host (aclrtMemcpy D2H) first.
static c10::Scalar read_scalar(const at::Tensor& t) {
  launch::count_synchronous();
  launch::drain(t.device().index());
  return at::_local_scalar_dense(cpu_alias(t));
}


namespace {

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (graph::any_capture_active()) graph::on_copy(self, dst, non_blocking);  // NPUGraph: record or refuse
  profiler::CopyScope copy_event(self, dst);
  copy_through_cpu(self, dst, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    if (dst.device().type() == kNpu) resize_(dst, self.sizes(), std::nullopt);
    else dst.resize_(self.sizes());
  }
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  if (graph::any_capture_active()) {
    graph::check_not_capturing("Reading an npu tensor on the host (.item(), aten::_local_scalar_dense)");
  }
  return read_scalar(self);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
}

}  // namespace npudist
