"""The `hccl` collective backend (ProcessGroupHCCL) for torch.distributed.

Importing this module registers the backend: ``dist.init_process_group("hccl")``,
``init_process_group("cpu:gloo,npu:hccl")``, ``new_group(backend="hccl")``, ``split_group`` and
``DeviceMesh("npu", ...)`` then use it. ``Backend.default_device_backend_map["npu"] == "hccl"``.

Options (torch_npu names)::

    opts = npudist.hccl.ProcessGroupHCCL.Options()
    opts.hccl_config = {"hccl_buffer_size": 64}        # MB; the group holds 2 x 64 MB per npu device
    dist.init_process_group("hccl", pg_options=opts, timeout=timedelta(seconds=60))

Environment (docs/hccl.md has the table): HCCL_BUFFSIZE (MB, default 200), HCCL_EXEC_TIMEOUT (s),
HCCL_CONNECT_TIMEOUT (s), HCCL_DETERMINISTIC, TORCH_HCCL_ASYNC_ERROR_HANDLING (HCCL_ASYNC_ERROR_HANDLING),
TORCH_HCCL_BLOCKING_WAIT, TORCH_HCCL_ENABLE_MONITORING, TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC,
TORCH_HCCL_TRACE_BUFFER_SIZE, TORCH_HCCL_DUMP_ON_TIMEOUT, TORCH_HCCL_DEBUG_INFO_TEMP_FILE,
NPUDIST_NODE_ID (node identity; default: host name), NPUDIST_HCCL_COMMUNICATOR (auto | gloo).
See docs/hccl.md and docs/debugging.md.
"""
from __future__ import annotations

import datetime as _dt

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import default_pg_timeout as _default_pg_timeout

from npudist import env

from . import _C
from ._C import ProcessGroupHCCL

__all__ = ["ProcessGroupHCCL", "is_available", "monitored_barrier", "dump_flight_recorder",
           "dump_flight_recorder_to_file"]

Options = ProcessGroupHCCL.Options


def is_available() -> bool:
    """True: the backend is built into this package (it needs no hardware)."""
    return True


def _create_backend(dist_opts, pg_options):
    """Creator called by torch.distributed (extended API) for every group that uses hccl."""
    env.check(("hccl", "engine"))   # a script may have set them after import; the extension reads them now
    if pg_options is None:
        opts = Options()
    elif isinstance(pg_options, Options):
        opts = pg_options.__copy__()
    else:
        raise ValueError(
            f"hccl: pg_options must be npudist.hccl.ProcessGroupHCCL.Options, got {type(pg_options).__name__}"
        )
    timeout = dist_opts.timeout
    if not isinstance(timeout, _dt.timedelta):
        timeout = _dt.timedelta(seconds=float(timeout))
    opts._timeout = timeout
    # Without an explicit timeout the op deadline comes from HCCL_EXEC_TIMEOUT when that is set.
    opts._timeout_from_user = timeout != _default_pg_timeout
    opts.global_ranks_in_group = list(dist_opts.global_ranks_in_group)
    opts.group_name = dist_opts.group_id
    _hand_over_runtime()
    return ProcessGroupHCCL(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, opts)


_runtime_handed_over = False


def _hand_over_runtime() -> None:
    """Pass the npu device runtime's C function table to the extension (npu tensors need it)."""
    global _runtime_handed_over
    if _runtime_handed_over:
        return
    try:
        import npudist._C as device_ext  # noqa: PLC0415 - optional: cpu-only use works without it
    except ImportError:
        return
    api = getattr(device_ext, "_runtime_api", None)
    if api is not None:
        _C._set_runtime_api(api())
        _runtime_handed_over = True
    launch_api = getattr(device_ext, "_launch_api", None)
    if launch_api is not None:
        _C._set_launch_api(launch_api())
    profiler_api = getattr(device_ext, "_profiler_api", None)
    if profiler_api is not None:
        _C._set_profiler_api(profiler_api())


def monitored_barrier(group=None, timeout: _dt.timedelta | None = None, wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier`` for hccl groups (torch's function accepts only gloo).

    Rank 0 waits up to ``timeout`` (default: the group's timeout) for every other rank and raises
    ``DistBackendError`` naming the first rank that did not arrive, or all of them with
    ``wait_all_ranks=True``; the other ranks raise if rank 0 does not release them in time.
    """
    if timeout is not None and (not isinstance(timeout, _dt.timedelta) or timeout <= _dt.timedelta(0)):
        raise ValueError(f"monitored_barrier: timeout must be a positive datetime.timedelta or None, got {timeout!r}")
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise ValueError("monitored_barrier: no default process group; call init_process_group first")
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def dump_flight_recorder(reason: str = "on demand") -> bytes:
    """This process's flight recorder (every hccl group), pickled in PyTorch's dump format, as
    ``torch._C._distributed_c10d._dump_nccl_trace()`` returns NCCL's: ``pickle.loads`` gives the dict."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    return _C._dump_trace(rank, reason)


def dump_flight_recorder_to_file(reason: str = "on demand") -> str:
    """Write the dump to ``$TORCH_HCCL_DEBUG_INFO_TEMP_FILE<rank>`` (default /tmp/hccl_trace_rank_<rank>), where
    ``python -m torch.distributed.flight_recorder.fr_trace`` and ``python -m npudist.hccl.trace`` read it."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    path = _C._dump_trace_file(rank, reason)
    if not path:
        raise RuntimeError("hccl: could not write the flight-recorder dump (check TORCH_HCCL_DEBUG_INFO_TEMP_FILE)")
    return path


def _register() -> None:
    if "hccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("hccl", _create_backend, extended_api=True, devices=["npu", "cpu"])
    dist.Backend.default_device_backend_map["npu"] = "hccl"
    # torch_npu code checks torch.distributed.is_hccl_available().
    if not hasattr(dist, "is_hccl_available"):
        dist.is_hccl_available = is_available


_register()
_hand_over_runtime()
