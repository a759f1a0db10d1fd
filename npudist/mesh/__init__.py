"""DeviceMesh (pp, dp_replicate, dp_shard, cp, tp) built from a plan; only dims of size > 1 get a group."""
from .device_mesh import (DIM_NAMES, DP_DIM, build_mesh, describe_mesh, dim_rank, dim_size, get_cp_mesh, get_dp_mesh,
                          get_ep_mesh, get_fsdp_mesh, get_pp_mesh, get_submesh, get_tp_mesh, physical_dims)
from npudist.plan.ranks import (MESH_DIM_NAMES, group_ranks, rank_coordinates, rank_of, stage_layer_ranges,
                     stages_of_rank)

__all__ = [
    "build_mesh", "describe_mesh", "get_cp_mesh", "get_ep_mesh", "physical_dims", "DIM_NAMES", "dim_rank", "dim_size", "get_dp_mesh", "get_fsdp_mesh", "get_pp_mesh",
    "get_submesh", "get_tp_mesh", "DP_DIM", "MESH_DIM_NAMES", "group_ranks", "rank_coordinates", "rank_of",
    "stage_layer_ranges", "stages_of_rank",
]
