"""Rank layout of a plan, computed without torch.distributed (used by ``npudist plan check`` and by the
pipeline builder, so both agree on who holds what).

Ranks are laid out row-major over the mesh dims (pp, dp_replicate, dp_shard, cp, tp) -- tp fastest, so tp
peers are neighbouring ranks (on real hardware: the same node) -- exactly as ``init_device_mesh`` does.
"""
from __future__ import annotations

from .schema import V_SHAPED_SCHEDULES, ParallelDegrees

MESH_DIM_NAMES = ParallelDegrees.DIM_NAMES

# Derived dims of the training mesh (npudist.mesh): each is a flattening of physical dims (those of size 1 are
# left out). With expert parallel (ep > 1) dp_shard itself is split into dp_shard_mod_ep x dp_shard_in_ep, so
# ep can borrow dp_shard_in_ep x cp as in torchtitan's ParallelDims.
DERIVED_DIMS = {
    "dp_shard": ("dp_shard_mod_ep", "dp_shard_in_ep"),
    "dp": ("dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep", "dp_shard"),  # the ranks reading different batches
    "dp_shard_cp": ("dp_shard_mod_ep", "dp_shard_in_ep", "dp_shard", "cp"),   # what FSDP shards over
    "ep": ("dp_shard_in_ep", "cp"),                                           # experts split over it
    "edp": ("dp_replicate", "dp_shard_mod_ep"),                               # ranks with the same experts
}


def physical_dims(degrees: ParallelDegrees) -> dict[str, int]:
    """The mesh's dims of size > 1 in mesh order; dp_shard split in two when ep borrows part of it."""
    dims = {}
    for name, size in degrees.sizes().items():
        if name == "dp_shard" and degrees.ep > 1:
            dims["dp_shard_mod_ep"] = size // degrees.dp_shard_in_ep
            dims["dp_shard_in_ep"] = degrees.dp_shard_in_ep
        else:
            dims[name] = size
    return {n: s for n, s in dims.items() if s > 1}


def process_groups_of_rank(degrees: ParallelDegrees) -> list[str]:
    """The process groups every rank of a training run belongs to: the world group, then one per mesh dim and
    flattened dim the mesh builds (npudist.mesh.build_mesh), except those spanning the whole world, for which
    torch's DeviceMesh reuses the world group. Each is one hccl communicator on the rank's device."""
    dims = physical_dims(degrees)
    world = degrees.world_size
    groups = ["world"] if world > 1 else []
    groups += [n for n, s in dims.items() if s < world]
    for name, parts in DERIVED_DIMS.items():
        if name in ("ep", "edp") and degrees.ep == 1:
            continue
        present = [p for p in parts if p in dims]
        size = 1
        for p in present:
            size *= dims[p]
        if len(present) > 1 and size < world:
            groups.append(name)
    return groups


def rank_coordinates(degrees: ParallelDegrees, rank: int) -> dict[str, int]:
    """Coordinate of ``rank`` along every mesh dim (0 along dims of size 1)."""
    if not 0 <= rank < degrees.world_size:
        raise ValueError(f"rank {rank} is outside the world of {degrees.world_size} ranks")
    coords, rest = {}, rank
    for name in reversed(MESH_DIM_NAMES):
        size = getattr(degrees, name)
        coords[name] = rest % size
        rest //= size
    return {name: coords[name] for name in MESH_DIM_NAMES}


def rank_of(degrees: ParallelDegrees, coords: dict[str, int]) -> int:
    """Inverse of rank_coordinates; missing dims count as 0."""
    rank = 0
    for name in MESH_DIM_NAMES:
        rank = rank * getattr(degrees, name) + coords.get(name, 0)
    return rank


def group_ranks(degrees: ParallelDegrees, dim: str, rank: int) -> list[int]:
    """Ranks that share a process group with ``rank`` along ``dim`` (its peers, including itself). Besides
    the mesh dims, ``ep`` (expert parallel: a block of dp_shard_in_ep consecutive dp_shard coordinates x
    every cp coordinate, as npudist.mesh lays it out) and ``edp`` (the ranks holding the same experts)."""
    coords = rank_coordinates(degrees, rank)
    if dim in ("ep", "edp"):
        inner = degrees.dp_shard_in_ep
        base, offset = divmod(coords["dp_shard"], inner)
        if dim == "ep":
            return sorted(rank_of(degrees, {**coords, "dp_shard": base * inner + j, "cp": c})
                          for j in range(inner) for c in range(degrees.cp))
        return sorted(rank_of(degrees, {**coords, "dp_replicate": r, "dp_shard": b * inner + offset})
                      for r in range(degrees.dp_replicate) for b in range(degrees.dp_shard // inner))
    return [rank_of(degrees, {**coords, dim: i}) for i in range(getattr(degrees, dim))]


def stage_layer_ranges(n_layers: int, num_stages: int, split_points: list[int] | None = None) -> list[range]:
    """Block indices (positions in the model layout's ``blocks``) of every pipeline stage. Without split
    points the blocks are spread evenly (the plan validator requires n_layers % num_stages == 0 then)."""
    if num_stages < 1 or n_layers < num_stages:
        raise ValueError(f"cannot split {n_layers} layers into {num_stages} stages")
    if split_points is None:
        if n_layers % num_stages:
            raise ValueError(f"{n_layers} layers are not divisible by {num_stages} stages; give split points")
        per = n_layers // num_stages
        split_points = [per * i for i in range(1, num_stages)]
    if len(split_points) != num_stages - 1:
        raise ValueError(f"{num_stages} stages need {num_stages - 1} split points, got {split_points}")
    bounds = [0, *split_points, n_layers]
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"split points {split_points} must be strictly increasing within (0, {n_layers})")
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def stages_of_rank(pp_rank: int, pp_degree: int, virtual_stages: int, schedule: str) -> list[int]:
    """Global stage indices held by pipeline rank ``pp_rank``: loop order (rank r holds r, r+pp, ...) for
    interleaved schedules, V order (rank r holds r and 2*pp-1-r) for ZBVZeroBubble -- matching torch's
    ``generate_stage_to_rank_mapping``."""
    if not 0 <= pp_rank < pp_degree:
        raise ValueError(f"pp rank {pp_rank} outside [0, {pp_degree})")
    if schedule in V_SHAPED_SCHEDULES:
        if virtual_stages != 2:
            raise ValueError(f"{schedule} needs exactly 2 stages per rank, got {virtual_stages}")
        return [pp_rank, 2 * pp_degree - 1 - pp_rank]
    return [pp_rank + v * pp_degree for v in range(virtual_stages)]
