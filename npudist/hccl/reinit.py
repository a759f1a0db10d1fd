"""torch_npu's ``torch_npu.distributed.reinit_process_group(group=None, rebuild_link=True)`` on npudist's hccl.

``rebuild_link=True``: the group's hccl communicator is aborted (ops pending on it fail, here and on the peers
that share it, with an error naming ``abort_hccl_comm(reinit)``) and dropped, and the group's next op builds a
new one with the other ranks; the group object, its name and its options stay, so training continues on it.
Every rank of the group calls it (as after a fault), in any order and at any time: the rebuild meets under a
new generation of the group's store keys, bounded by the group's timeout, and an op on a rank that did not
call it fails instead of hanging (docs/hccl.md, "Rebuilding a communicator").
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from npudist.hccl import ProcessGroupHCCL

logger = logging.getLogger(__name__)


def _hccl_backends(group) -> list:
    """The group's hccl backends, each once: usually the npu one (which serves cpu too with "hccl"), the cpu one
    of a "cpu:hccl" group."""
    found = []
    for device in group._device_types:
        try:
            backend = group._get_backend(device)
        except RuntimeError:
            continue
        if isinstance(backend, ProcessGroupHCCL) and all(backend is not b for b in found):
            found.append(backend)
    return found


def reinit_process_group(group=None, rebuild_link: bool = True):
    """Rebuild ``group``'s hccl communicator (``group=None``: the default group); returns the group.

    Only hccl acts: for a group whose backend is not hccl (e.g. gloo) nothing happens and the group is
    returned, as torch_npu reads the backend name from ``torch.distributed``'s registry and acts on hccl alone.
    A group mixing backends (``"cpu:gloo,npu:hccl"``) rebuilds its hccl (npu) communicator.

    ``rebuild_link=False`` is torch_npu's second half of the fault recovery of ``torch.npu.stop_device`` /
    ``restart_device``: it resumes the hccl communicators those suspended and returns None, for every group of
    the process (``group`` is not read). npudist refuses ``stop_device`` and ``restart_device`` (an emulated
    device has no uncorrectable memory error to recover from, docs/torch_npu.md), so no communicator is ever
    suspended and there is nothing to resume: the call returns None and leaves every group as it was, which is
    what torch_npu's resume leaves behind on communicators that were not suspended.
    """
    if not dist.is_initialized():
        raise RuntimeError("reinit_process_group: the default process group is not initialized; call "
                           "torch.distributed.init_process_group first")
    device_id = torch.npu.current_device()
    logger.info("reinit process group, group=%s, rebuild link=%s, device=%s", group, rebuild_link, device_id)
    if group is None:
        group = _c10d._world.default_pg
    if not rebuild_link:
        logger.info("resume hccl comm end, device_id=%s: no communicator is suspended (stop_device is refused)",
                    device_id)
        return None
    entry = _c10d._world.pg_map.get(group) if isinstance(group, dist.ProcessGroup) else None
    if entry is None:
        raise ValueError(f"reinit_process_group: {group!r} is not a process group of this process (destroyed, or "
                         "this rank is not one of its members); pass a group returned by new_group on a member "
                         "rank, or None for the default group")
    if "hccl" in dist.Backend(entry[0]):
        logger.info("reinit hccl comm start, group=%s, device_id=%s", group, device_id)
        for backend in _hccl_backends(group):
            backend.abort_hccl_comm("reinit")
    logger.info("reinit hccl comm end, group=%s, device_id=%s", group, device_id)
    return group
