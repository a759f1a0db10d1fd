"""Build the training DeviceMesh from a plan's parallel degrees.

Only dims of size > 1 become mesh dims (in the order pp, dp_replicate, dp_shard, tp): torch's DeviceMesh
creates a process group for every dim, even one of size 1, and on this backend every group costs shared
memory and a communicator. The helpers below hide the missing dims: a missing dim has size 1 and local
rank 0, and ``get_*_mesh`` return None for it.
"""
from __future__ import annotations

import weakref

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from npudist.plan.schema import ParallelConfig, ParallelDegrees

from npudist.plan.ranks import MESH_DIM_NAMES

DP_DIM = "dp"   # flattened dp_replicate x dp_shard, created only when both are > 1

# Flattened dp meshes by root mesh: torch deprecates slicing a flattened dim from the root mesh and asks
# callers to keep the flattened mesh themselves.
_FLAT_DP: "weakref.WeakKeyDictionary[DeviceMesh, DeviceMesh]" = weakref.WeakKeyDictionary()


def _as_degrees(parallel) -> ParallelDegrees:
    if isinstance(parallel, ParallelDegrees):
        return parallel
    if isinstance(parallel, ParallelConfig):
        if parallel.dp_shard_degree == -1:
            return parallel.resolve(dist.get_world_size())
        return parallel.degrees()
    raise TypeError(f"build_mesh expects ParallelDegrees or ParallelConfig, got {type(parallel).__name__}")


def build_mesh(parallel, device_type: str = "npu") -> DeviceMesh:
    """DeviceMesh over the dims of size > 1 of ``parallel`` (ParallelDegrees, or a ParallelConfig whose
    dp_shard_degree -1 is filled from the world size). Collective: every rank must call it.
    A one-rank world gets a 1-D mesh ("dp_shard",) of size 1 over the default group."""
    if not dist.is_initialized():
        raise RuntimeError("build_mesh needs torch.distributed initialized first: call "
                           "dist.init_process_group(backend) (npurun/torchrun set the rendezvous env vars)")
    degrees = _as_degrees(parallel)
    world = dist.get_world_size()
    if degrees.world_size != world:
        raise ValueError(f"parallel degrees {degrees.sizes()} multiply to {degrees.world_size} ranks but the "
                         f"process group has {world}; fix the plan or the --nproc count")
    dims = degrees.active_dims() or {"dp_shard": 1}
    mesh = init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))
    if "dp_replicate" in dims and "dp_shard" in dims:
        _FLAT_DP[mesh] = mesh["dp_replicate", "dp_shard"]._flatten(DP_DIM)
    return mesh


def _names(mesh: DeviceMesh) -> tuple[str, ...]:
    return tuple(mesh.mesh_dim_names or ())


def dim_size(mesh: DeviceMesh, name: str) -> int:
    """Size of mesh dim ``name``; 1 if the dim was not built (size-1 dims are never built)."""
    _check_name(name)
    if name == DP_DIM:
        return dim_size(mesh, "dp_replicate") * dim_size(mesh, "dp_shard")
    return mesh.size(_names(mesh).index(name)) if name in _names(mesh) else 1


def dim_rank(mesh: DeviceMesh, name: str) -> int:
    """This rank's coordinate along ``name``; 0 if the dim was not built."""
    _check_name(name)
    if name == DP_DIM:
        return dim_rank(mesh, "dp_replicate") * dim_size(mesh, "dp_shard") + dim_rank(mesh, "dp_shard")
    return mesh.get_local_rank(name) if name in _names(mesh) else 0


def _check_name(name: str) -> None:
    if name not in MESH_DIM_NAMES and name != DP_DIM:
        raise ValueError(f"unknown mesh dim {name!r}; dims are {MESH_DIM_NAMES + (DP_DIM,)}")


def get_submesh(mesh: DeviceMesh, name: str) -> DeviceMesh | None:
    """1-D sub-mesh along ``name``, or None if that dim has size 1 (no process group exists for it)."""
    _check_name(name)
    if name == DP_DIM:
        return get_dp_mesh(mesh)
    return mesh[name] if name in _names(mesh) and dim_size(mesh, name) > 1 else None


def get_tp_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    return get_submesh(mesh, "tp")


def get_pp_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    return get_submesh(mesh, "pp")


def get_dp_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    """1-D mesh over all data-parallel ranks (replicas x shards): shard the data and average the loss
    over it. None if there is no data parallelism."""
    names = _names(mesh)
    rep, shard = "dp_replicate" in names, "dp_shard" in names and dim_size(mesh, "dp_shard") > 1
    if rep and shard:
        if mesh not in _FLAT_DP:
            raise ValueError("this mesh has dp_replicate and dp_shard dims but was not made by build_mesh, "
                             "so no flattened dp mesh exists")
        return _FLAT_DP[mesh]
    if rep:
        return mesh["dp_replicate"]
    return mesh["dp_shard"] if shard else None


def get_fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    """Mesh to pass to ``fully_shard``: 2-D (dp_replicate, dp_shard) for HSDP, 1-D dp_shard for FSDP.
    None when dp_shard is 1: then there is nothing to shard (with dp_replicate > 1, reduce gradients over
    ``get_dp_mesh`` like DDP)."""
    names = _names(mesh)
    if "dp_shard" not in names or dim_size(mesh, "dp_shard") <= 1:
        return None
    return mesh["dp_replicate", "dp_shard"] if "dp_replicate" in names else mesh["dp_shard"]


def describe_mesh(mesh: DeviceMesh) -> str:
    """One line: dims, sizes and this rank's coordinates, e.g. 'mesh dp_shard=2 x tp=2 on npu; rank 3 at ...'."""
    dims = " x ".join(f"{n}={dim_size(mesh, n)}" for n in _names(mesh))
    coords = ", ".join(f"{n}={dim_rank(mesh, n)}" for n in _names(mesh))
    return f"mesh {dims} on {mesh.device_type}; rank {dist.get_rank()} at {coords}"
