"""``import torch_npu``, as every Ascend script starts, gives npudist's emulated npu device and hccl backend.

Scripts written for Huawei's torch_npu run unchanged on npudist: ``import torch_npu`` registers ``torch.npu``,
``tensor.npu()``, ``torch.device("npu")`` and ``init_process_group("hccl")``; ``torch_npu.npu`` is
``torch.npu`` (``torch_npu.npu.synchronize()``, ``torch_npu.npu.set_device(...)``, ``import torch_npu.npu``).
Only what npudist implements is there: Ascend custom operators (``torch_npu.npu_*`` fused kernels),
graph mode and ``torch_npu.contrib`` are absent, and using them raises AttributeError/ImportError.
Do not install this next to Huawei's real torch_npu.
"""
import sys

import torch

import npudist  # noqa: F401  (registers the npu device and the hccl backend)

npu = torch.npu
sys.modules[__name__ + ".npu"] = npu
__version__ = npudist.__version__
