"""Build the training DeviceMesh from a plan's parallel degrees.

Only dims of size > 1 become mesh dims (in the order pp, dp_replicate, dp_shard, cp, tp): torch's DeviceMesh
creates a process group for every dim, even one of size 1, and on this backend every group costs shared
memory and a communicator. The helpers below hide the missing dims: a missing dim has size 1 and local
rank 0, and ``get_*_mesh`` return None for it.
"""
from __future__ import annotations

import weakref

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from npudist.plan.schema import ParallelConfig, ParallelDegrees

from npudist.plan.ranks import DERIVED_DIMS, MESH_DIM_NAMES, physical_dims

DP_DIM = "dp"   # flattened dp_replicate x dp_shard: the ranks that read different batches

DIM_NAMES = MESH_DIM_NAMES + tuple(n for n in DERIVED_DIMS if n not in MESH_DIM_NAMES)

# Flattened meshes by root mesh: torch deprecates slicing a flattened dim from the root mesh and asks
# callers to keep the flattened mesh themselves.
_FLAT: "weakref.WeakKeyDictionary[DeviceMesh, dict[str, DeviceMesh]]" = weakref.WeakKeyDictionary()
# The degrees a mesh was built for: ep == cp leaves no dim of its own, so only they tell ep 1 from ep > 1.
_DEGREES: "weakref.WeakKeyDictionary[DeviceMesh, ParallelDegrees]" = weakref.WeakKeyDictionary()


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
    dims = physical_dims(degrees) or {"dp_shard": 1}
    mesh = init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))
    flat = _FLAT[mesh] = {}
    _DEGREES[mesh] = degrees
    # Every rank creates the same flattened groups in the same order (group creation is collective).
    for name, parts in DERIVED_DIMS.items():
        if name in ("ep", "edp") and degrees.ep == 1:
            continue
        present = tuple(p for p in parts if p in dims and dims[p] > 1)
        if len(present) > 1:
            flat[name] = mesh[present]._flatten(name)
    return mesh


def _names(mesh: DeviceMesh) -> tuple[str, ...]:
    return tuple(mesh.mesh_dim_names or ())


def _parts(mesh: DeviceMesh, name: str) -> tuple[str, ...]:
    """The built dims ``name`` consists of (itself if it is a built dim)."""
    names = _names(mesh)
    if name in names:
        return (name,)
    if name in ("ep", "edp") and getattr(_DEGREES.get(mesh), "ep", 1) == 1:
        return ()   # no expert parallelism: no expert groups
    return tuple(p for p in DERIVED_DIMS.get(name, ()) if p in names)


def dim_size(mesh: DeviceMesh, name: str) -> int:
    """Size of mesh dim ``name`` (a dim or a derived dim like dp, ep); 1 if none of it was built."""
    _check_name(name)
    size = 1
    for part in _parts(mesh, name):
        size *= mesh.size(_names(mesh).index(part))
    return size


def dim_rank(mesh: DeviceMesh, name: str) -> int:
    """This rank's coordinate along ``name`` (row-major over its parts); 0 if none of it was built."""
    _check_name(name)
    rank = 0
    for part in _parts(mesh, name):
        rank = rank * mesh.size(_names(mesh).index(part)) + mesh.get_local_rank(part)
    return rank


def _check_name(name: str) -> None:
    if name not in DIM_NAMES and name not in ("dp_shard_mod_ep", "dp_shard_in_ep"):
        raise ValueError(f"unknown mesh dim {name!r}; dims are {DIM_NAMES}")


def get_submesh(mesh: DeviceMesh, name: str) -> DeviceMesh | None:
    """1-D sub-mesh along ``name`` (a dim or a derived dim), or None if it has size 1 (no process group)."""
    _check_name(name)
    parts = _parts(mesh, name)
    if not parts or dim_size(mesh, name) <= 1:
        return None
    if len(parts) == 1:
        return mesh[parts[0]]
    flat = _FLAT.get(mesh, {})
    if name not in flat:
        raise ValueError(f"this mesh has the dims {parts} of {name!r} but was not made by build_mesh, so no "
                         "flattened mesh exists")
    return flat[name]


def get_tp_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    return get_submesh(mesh, "tp")


def get_pp_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    return get_submesh(mesh, "pp")


def get_cp_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    return get_submesh(mesh, "cp")


def get_ep_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    return get_submesh(mesh, "ep")


def get_dp_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    """1-D mesh over all data-parallel ranks (replicas x shards): shard the data and average the loss
    over it. None if there is no data parallelism."""
    return get_submesh(mesh, DP_DIM)


def get_fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh | None:
    """Mesh to pass to ``fully_shard``: 2-D (dp_replicate, dp_shard x cp) for HSDP, 1-D dp_shard x cp for
    FSDP. Context-parallel ranks see different tokens of the same sequences, so their gradients are
    averaged like those of data-parallel ranks (torchtitan's dp_shard_cp). None when dp_shard x cp is 1:
    then there is nothing to shard (with dp_replicate > 1, reduce gradients over ``get_dp_mesh`` like DDP)."""
    shard = get_submesh(mesh, "dp_shard_cp")
    if shard is None:
        return None
    if "dp_replicate" not in _names(mesh):
        return shard
    parts = _parts(mesh, "dp_shard_cp")
    if len(parts) == 1:
        return mesh["dp_replicate", parts[0]]
    return mesh["dp_replicate", "dp_shard_cp"]


def describe_mesh(mesh: DeviceMesh) -> str:
    """One line: dims, sizes and this rank's coordinates, e.g. 'mesh dp_shard=2 x tp=2 on npu; rank 3 at ...'."""
    dims = " x ".join(f"{n}={dim_size(mesh, n)}" for n in _names(mesh))
    coords = ", ".join(f"{n}={dim_rank(mesh, n)}" for n in _names(mesh))
    return f"mesh {dims} on {mesh.device_type}; rank {dist.get_rank()} at {coords}"
