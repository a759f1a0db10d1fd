"""``torch_npu.distributed``: Ascend's distributed extras on npudist (docs/torch_npu.md, docs/hccl.md).

``is_hccl_available``, the uneven collectives ``all_gather_into_tensor_uneven`` /
``reduce_scatter_tensor_uneven`` (dim-0 splits differing per rank) and ``all_to_all_vc`` (a variable-count
all-to-all from the full send-count matrix), composed from ``all_to_all_single``; ``reinit_process_group``
(rebuild a group's hccl communicator after a fault; npudist/hccl/reinit.py).
"""
from npudist.hccl import is_available as is_hccl_available
from npudist.hccl.all_to_all_vc import all_to_all_vc
from npudist.hccl.reinit import reinit_process_group
from npudist.hccl.uneven import all_gather_into_tensor_uneven, reduce_scatter_tensor_uneven

__all__ = ["is_hccl_available", "reinit_process_group", "all_gather_into_tensor_uneven", "reduce_scatter_tensor_uneven",
           "all_to_all_vc"]
