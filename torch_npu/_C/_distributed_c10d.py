"""``torch_npu._C._distributed_c10d``: ``ProcessGroupHCCL`` is npudist's hccl backend class itself
(npudist.hccl), with ``ProcessGroupHCCL.Options()`` (consumed by ``init_process_group`` / ``new_group`` /
``DeviceMesh`` as ``pg_options``) and ``get_hccl_comm_name(rankid, init_comm=True)`` on the backend object
(``pg._get_backend(torch.device("npu")).get_hccl_comm_name(rank)``), the ``hcom`` of the MC2 operators.
"""
from npudist.hccl import ProcessGroupHCCL
from npudist.hccl import comm_name as _comm_name

__all__ = ["ProcessGroupHCCL"]

_comm_name.install()
