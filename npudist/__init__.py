"""npudist: distributed training for PyTorch on (emulated) NPU devices.

Importing npudist registers the ``npu`` device (``torch.npu``, ``tensor.npu()``, ``torch.device("npu:0")``)
and the ``hccl`` process-group backend, so ``init_process_group("hccl")`` works afterwards.
"""
from npudist import device  # noqa: F401  (registers the npu device; must come first)
from npudist import hccl  # noqa: F401  (registers the hccl backend)

__version__ = "0.1.0"
