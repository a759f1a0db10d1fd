"""``torch_npu.utils``: tensor combining, thread affinity, asynchronous saving, the CANN version and the FLOP
counter (docs/torch_npu.md)."""
from torch_npu.utils.affinity import reset_thread_affinity, set_thread_affinity
from torch_npu.utils.cann_version import get_cann_version
from torch_npu.utils.flops_count import _FlopsCounter as FlopsCounter
from torch_npu.utils.combine_tensors import get_part_combined_tensor, is_combined_tensor_valid, npu_combine_tensors
from torch_npu.utils.serialization import save_async

__all__ = ["npu_combine_tensors", "get_part_combined_tensor", "is_combined_tensor_valid", "set_thread_affinity",
           "reset_thread_affinity", "save_async", "get_cann_version", "FlopsCounter"]
