"""npudist: distributed training for PyTorch on (emulated) NPU devices.

Importing npudist registers the ``npu`` device (``torch.npu``, ``tensor.npu()``, ``torch.device("npu:0")``)
and the ``hccl`` process-group backend, so ``init_process_group("hccl")`` works afterwards, and Ascend's fused
operators as ``torch.ops.npu.*`` (npu tensors only; cpu code is unaffected).
"""
from npudist import device  # noqa: F401  (registers the npu device; must come first)
from npudist import hccl  # noqa: F401  (registers the hccl backend)
from npudist import ops  # noqa: F401  (registers the fused operators, torch.ops.npu.*)

__version__ = "0.1.0"


def __getattr__(name):
    # `npudist.parallelize` is imported lazily: it pulls in FSDP/TP/pipelining, which plain device or
    # backend users should not pay for at `import npudist`.
    if name == "parallelize":
        from npudist.parallelize import parallelize

        return parallelize
    raise AttributeError(f"module 'npudist' has no attribute {name!r}")
