"""``torch.npu``: the emulated NPU device, mirroring ``torch.cuda``.

Importing this package loads the C++ device core (``npudist._C``), renames PyTorch's PrivateUse1 backend
to ``npu`` and registers this module as ``torch.npu``. ``torch.npu.memory`` is :mod:`npudist.device.memory`
and its public names are re-exported here.
"""
import sys

from npudist import env as _env

from npudist.device import _registration, cuda_dtypes, kernel_queue, linear_ce_defaults, meta_warnings, shallow_copy
from npudist.device.kernel_queue import utilization
from npudist.device.core import (
    current_device,
    device,
    device_count,
    device_of,
    get_device_capability,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    is_initialized,
    set_device,
    synchronize,
)
from npudist.device.streams import (
    Event,
    StreamContext,
    Stream,
    SyncLaunchStream,
    current_stream,
    default_stream,
    set_stream,
    stream,
)
from npudist.device.random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from npudist.device.graphs import (
    NPUGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from npudist.device import graph_handlers, graph_task_update
from npudist.device.graph_task_update import *  # noqa: F401,F403  (graph_task_update.__all__)
from npudist.device.graph_handlers import *  # noqa: F401,F403  (graph_handlers.__all__)
from npudist.device import super_kernel
from npudist.device.super_kernel import *  # noqa: F401,F403  (super_kernel.__all__)
from npudist.device.amp import (
    get_amp_supported_dtype,
    is_bf16_supported,
)
from npudist.device import amp, memory
from npudist.device.compat import *  # noqa: F401,F403  (Ascend-only names, compat.__all__)
from npudist.device import compat
from npudist.device.memory import *  # noqa: F401,F403  (names listed in memory.__all__)
# torch_npu's names beyond torch.cuda's (docs/torch_npu_surface.md); each module's __all__.
from npudist.device import ascend_amp, ascend_options, ascend_runtime, legacy_storage, sync_debug
from npudist.device.ascend_amp import *  # noqa: F401,F403
from npudist.device.ascend_options import *  # noqa: F401,F403
from npudist.device.ascend_runtime import *  # noqa: F401,F403
from npudist.device.legacy_storage import *  # noqa: F401,F403
from npudist.device.mstx import mstx
from npudist.device import op_dump
from npudist.device.op_dump import finalize_dump, init_dump, set_dump  # operator data dump (docs/debugging.md)
from npudist.device.sync_debug import *  # noqa: F401,F403


def _is_in_bad_fork() -> bool:
    """Always False: the emulated device keeps working in forked children (host memory, lazy workers)."""
    return False


__all__ = [
    "Event", "NPUGraph", "Stream", "StreamContext", "amp", "current_device", "current_stream", "default_generators",
    "default_stream", "device", "device_count", "device_of", "get_amp_supported_dtype",
    "get_device_capability", "get_device_name", "get_device_properties", "get_rng_state", "get_rng_state_all",
    "graph", "graph_pool_handle", "init", "initial_seed", "is_available", "is_bf16_supported",
    "is_current_stream_capturing", "is_initialized", "make_graphed_callables", "manual_seed",
    "manual_seed_all", "memory", "seed", "seed_all", "set_device", "set_rng_state", "set_rng_state_all",
    "set_stream", "stream", "synchronize", "SyncLaunchStream", "utilization",
] + list(memory.__all__) + [n for n in compat.__all__ if not n.startswith("_")] + ["mstx"] + [
    n for m in (ascend_amp, ascend_options, ascend_runtime, legacy_storage, op_dump, sync_debug, graph_task_update,
                graph_handlers, super_kernel) for n in m.__all__]

_registration.register(__name__)
shallow_copy.register()
meta_warnings.install()
linear_ce_defaults.register()
kernel_queue.register()
cuda_dtypes.register()
# The public name of kernel launch is torch.npu.launch (is_blocking, launch_counts, host_ordered_call; Inductor's
# generated npu code calls torch.npu.launch.host_ordered_call).
launch = kernel_queue
# torch.npu.npugraph_ex (torch_npu's graph-mode module); its package is cheap to import (Dynamo loads on first use),
# and the sys.modules entry makes `import torch.npu.npugraph_ex` work on this non-package module.
from npudist.compile import npugraph_ex  # noqa: E402
sys.modules["torch.npu.npugraph_ex"] = npugraph_ex
sys.modules["torch.npu.npugraph_ex.inference"] = npugraph_ex.inference

if _env.read("NPUDIST_STREAM_SANITIZER"):
    from npudist.device import sanitizer   # only when asked for (docs/debugging.md): no mode installed otherwise
    sanitizer.enable()


def __getattr__(name):
    if name == "_sanitizer":   # torch.npu._sanitizer.enable_npu_sanitizer(), as torch.cuda._sanitizer
        from npudist.device import sanitizer
        return sanitizer
    # Inductor looks up torch.npu.Scheduling & co. on the first torch.compile; npudist.compile answers lazily.
    from npudist.compile import lookup_codegen
    return lookup_codegen(name)


# Last: the rest of the registration that torch's autoload left to this package when it was imported first.
from npudist import _deferred  # noqa: E402

_deferred.run_pending()
