"""The communicator name of an hccl group, torch_npu's ``get_hccl_comm_name(rankid, init_comm=True)``, and the
reverse lookup that the MC2 operators use to find the group their ``hcom`` argument names.

The name is the group's communicator name (``ProcessGroupHCCL.comm_name``) without its node suffix: a random
token drawn by the group's rank 0 when the group is created, so it is the same on every rank of the group,
differs between groups (also between groups of the same ranks), and stays the same for the group's lifetime.
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist

from npudist.hccl import ProcessGroupHCCL

_NODE_SUFFIX = re.compile(r"_n\d+$")


def get_hccl_comm_name(backend: ProcessGroupHCCL, rankid: int, init_comm: bool = True) -> str:
    """The group-wide name of ``backend``'s communicator; ``rankid`` is the caller's global rank (checked to
    belong to the group). Communicators are created with the group, so ``init_comm`` changes nothing."""
    if isinstance(rankid, bool) or not isinstance(rankid, int):
        raise ValueError(f"get_hccl_comm_name: rankid must be an int (the caller's global rank), got {rankid!r}")
    members = list(backend.options.global_ranks_in_group)
    if members and rankid not in members:
        raise ValueError(f"get_hccl_comm_name: rank {rankid} is not in this group (global ranks {members})")
    if not members and not 0 <= rankid < backend.size():
        raise ValueError(f"get_hccl_comm_name: rank {rankid} is out of range for a group of {backend.size()} ranks")
    return _NODE_SUFFIX.sub("", backend.comm_name)


def backend_of(hcom: str) -> ProcessGroupHCCL:
    """The hccl backend of this process whose :func:`get_hccl_comm_name` is ``hcom`` (ValueError if none)."""
    if not isinstance(hcom, str) or not hcom:
        raise ValueError(f"hcom must be a communicator name from get_hccl_comm_name, got {hcom!r}")
    names = []
    if dist.is_initialized():
        for pg in list(dist.distributed_c10d._world.pg_map):
            try:
                backend = pg._get_backend(torch.device("npu"))
            except RuntimeError:
                continue
            if isinstance(backend, ProcessGroupHCCL):
                name = _NODE_SUFFIX.sub("", backend.comm_name)
                if name == hcom:
                    return backend
                names.append(name)
    raise ValueError(f"hcom {hcom!r} names no hccl group of this process (groups: {names or 'none'}); pass "
                     "pg._get_backend(torch.device('npu')).get_hccl_comm_name(rank) of the group to use")


def install() -> None:
    """``ProcessGroupHCCL.get_hccl_comm_name`` and ``ProcessGroupHCCL.Options.group_id``, the names
    torch_npu's clients use (group_id is torch's group name, which the binding calls group_name)."""
    if not hasattr(ProcessGroupHCCL, "get_hccl_comm_name"):
        ProcessGroupHCCL.get_hccl_comm_name = get_hccl_comm_name
    if not hasattr(ProcessGroupHCCL.Options, "group_id"):
        ProcessGroupHCCL.Options.group_id = property(lambda o: o.group_name,
                                                     lambda o, v: setattr(o, "group_name", v))
