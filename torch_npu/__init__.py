"""``import torch_npu``, as every Ascend script starts, gives npudist's emulated npu device, hccl and fused ops.

Scripts and libraries written for Huawei's torch_npu run unchanged on npudist: ``import torch_npu`` registers
``torch.npu``, ``tensor.npu()``, ``torch.device("npu")`` and ``init_process_group("hccl")``; ``torch_npu.npu`` is
``torch.npu``; Ascend's fused operators are ``torch.ops.npu.*`` and are copied onto this package's top level
(``from torch_npu import npu_fusion_attention``), as upstream does. Gradient checkpointing's default device
becomes npu (as upstream). An Ascend operator npudist does not provide raises AttributeError naming it.
``torch_npu.contrib.transfer_to_npu`` runs CUDA scripts on npu. Reference: docs/torch_npu.md.
Do not install this next to Huawei's real torch_npu.
"""
import sys

import torch
import torch.utils.checkpoint

import npudist
from npudist import ops as _ops
from npudist.ops import matmul as _matmul
from npudist.ops import optim as _optim
from npudist.ops import sharding as _sharding
from npudist.device.memory import erase_stream  # noqa: F401 (torch_npu's API)
from npudist.device.swapped_memory import empty_with_swapped_memory  # noqa: F401 (torch_npu's API)
from npudist.formats.hifloat8_tensor import HiFloat8Tensor  # noqa: F401 (torch_npu's API)
from torch_npu._C import _distributed_c10d as _c10d  # noqa: F401 (torch_npu._C._distributed_c10d.ProcessGroupHCCL)
from torch_npu._checksum import matmul_checksum  # noqa: F401 (torch_npu's API)

npudist.register()  # the npu device, the hccl backend and the npu operators (also when autoload is off)
npu = torch.npu
sys.modules[__name__ + ".npu"] = npu
sys.modules[__name__ + ".npu.npugraph_ex"] = npu.npugraph_ex
sys.modules[__name__ + ".npu.npugraph_ex.inference"] = npu.npugraph_ex.inference

# Ascend's torch_npu versions follow the torch release they are built for; the local part names npudist.
__version__ = f"{torch.__version__.split('+')[0]}+npudist{npudist.__version__}"

for _name in _ops.OPS:
    globals()[_name] = _ops.CALL_FORMS.get(_name) or getattr(torch.ops.npu, _name)
# The routing-map unpermute split into torch_npu's private forward and its grad operator, which hand-written
# autograd Functions call (torchtitan-npu's expert-parallel combine).
_npu_moe_token_unpermute_with_routing_map = torch.ops.npu._npu_moe_token_unpermute_with_routing_map
npu_moe_token_unpermute_with_routing_map_grad = torch.ops.npu.npu_moe_token_unpermute_with_routing_map_grad


def npu_apply_adam_w(*args, out=None, **kwargs):
    """Ascend's call form with ``out=(var, m, v)`` (see npudist.ops.optim)."""
    return _optim.apply_adam_w(*args, out=out, **kwargs)


def npu_grouped_matmul(x, weight, *, group_list=None, **kwargs):
    """``torch.ops.npu.npu_grouped_matmul``; ``group_list`` may also be a tensor (as Ascend accepts)."""
    if isinstance(group_list, torch.Tensor):
        group_list = [int(v) for v in group_list.tolist()]
    return torch.ops.npu.npu_grouped_matmul(x, weight, group_list=group_list, **kwargs)


# DTensor rules of the operators (import torch.distributed.tensor: too slow for every `import npudist`).
_sharding.register()

# Upstream torch_npu makes npu the device whose RNG state checkpointing saves when no tensor argument says.
torch.utils.checkpoint.DefaultDeviceType.set_device_type("npu")


def __getattr__(name):
    if name in ("profiler", "optim", "utils", "distributed", "contrib", "dynamo"):
        # `import torch_npu; torch_npu.profiler.profile(...)`, as Ascend scripts do (loaded on first use)
        import importlib  # noqa: PLC0415

        return importlib.import_module(__name__ + "." + name)
    if name.startswith("npu_"):
        raise AttributeError(
            f"torch_npu.{name} is an Ascend operator that npudist does not provide; provided: "
            f"{', '.join(_ops.OPS)} (docs/torch_npu.md)")
    raise AttributeError(f"module 'torch_npu' has no attribute {name!r}")
