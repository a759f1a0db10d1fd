"""Inductor backend for npu: the CPU C++/OpenMP code generator, run on npu memory.

npu memory is host memory (the emulated device's allocator hands out host pages), so the C++ kernels Inductor
generates for CPU read and write npu tensors in place, zero-copy, exactly like the eager fallback runs CPU
kernels on them. A real Ascend runtime would need its own scheduling here (device kernels), not this reuse.

What is npu-specific:
- the Python wrapper allocates every buffer with ``empty_strided(..., device='npu')``, so outputs and
  intermediates are npu tensors owned and counted by the npu caching allocator;
- extern kernels (``mm``, ``addmm``, SDPA...) and eager fallbacks inside a compiled graph are ordinary aten calls
  on npu tensors, so they dispatch through the npu device like eager code;
- C++ kernel calls are written as for CPU (no stream argument: the npu emulation runs host compute on the
  calling thread); under asynchronous launch a compiled graph runs host-ordered: the module's ``call`` drains
  the current stream and runs the graph's aten calls inline, so compiled graphs do not overlap with queued work;
- Inductor's CPU-only lowering and scheduling choices extended to npu (:mod:`npudist.compile.cpp_parity`).

Attention under tracing is set up earlier, at device registration (:mod:`npudist.compile.attention`).
"""
import functools
from textwrap import dedent

from torch._inductor import config
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    get_scheduling_for_device,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

from npudist.compile import cpp_parity, dynamo

BACKEND = "npu"


class NpuDeviceOpOverrides(DeviceOpOverrides):
    """Lines the Python wrapper emits for device management around npu kernels."""

    def import_get_raw_stream_as(self, name: str) -> str:
        # C++ kernels take no stream (see module docstring); Inductor still imports a getter by this name.
        return dedent(f"""
            def {name}(_):
                return 0
            """)

    def set_device(self, device_idx: int) -> str:
        return f"torch.npu.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.npu.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.npu.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


class NpuWrapperCodegen(PythonWrapperCodegen):
    """Python wrapper for npu graphs: calls the C++ kernels the way the CPU wrapper does."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NpuWrapperCodegen()

    def generate_after_suffix(self, result):
        # The C++ kernels read and write npu bytes through raw pointers on the host, so under asynchronous
        # launch the whole graph runs host-ordered: the module's launcher drains the current stream first and
        # runs the graph's aten calls inline (npudist.device.kernel_queue.host_ordered_call).
        super().generate_after_suffix(result)
        name = self.launcher_fn_name
        result.writeline(f"{name} = torch.npu.launch.host_ordered_call({name})")

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        from torch._inductor.virtualized import V

        device = device or V.graph.get_current_device_or_throw()
        if device.type == BACKEND and not triton:
            # The base class knows only cpu/mps/cuda/xpu; an npu C++ kernel is called exactly like a CPU one.
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)


class NpuScheduling(CppScheduling):
    """The CPU C++ scheduling, generating its kernels with Inductor's backend questions answered as for CPU.

    ``torch._inductor.utils.get_current_backend()`` answers ``config.cpu_backend`` ("cpp") only for device type
    "cpu" and ``config.cuda_backend`` ("triton") for every other device; kernel codegen asks it to choose
    Triton-only paths (``masked`` dtype propagation, fp16/bf16 compute upcasts, runtime asserts). While npu
    kernels are generated, ``cuda_backend`` is set to the CPU backend — scoped to this codegen, no global flip.
    """

    def codegen_node(self, node):
        with config.patch(cuda_backend=config.cpu_backend):
            return super().codegen_node(node)

    def codegen_template(self, *args, **kwargs):
        with config.patch(cuda_backend=config.cpu_backend):
            return super().codegen_template(*args, **kwargs)


# Names torch.npu exposes for Inductor's init_backend_registration (see npudist.compile).
Scheduling = NpuScheduling
PythonWrapperCodegen = NpuWrapperCodegen
CppWrapperCodegen = CppWrapperCpu
WrapperFxCodegen = WrapperFxCodegen


@functools.cache
def register() -> None:
    """Register npu with Inductor (scheduling, wrappers, device op overrides) and Dynamo; idempotent."""
    if get_scheduling_for_device(BACKEND) is None:
        from npudist.compile import codegen_config

        register_backend_for_device(BACKEND, Scheduling, PythonWrapperCodegen, CppWrapperCodegen, WrapperFxCodegen,
                                    device_custom_config=codegen_config)
    register_device_op_overrides(BACKEND, NpuDeviceOpOverrides())
    dynamo.register()
    cpp_parity.apply()
