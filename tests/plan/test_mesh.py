"""build_mesh on gloo (CPU) and hccl (npu): dims of size 1 are absent and create no process group, the layout matches
the torch-free rank_coordinates, and every sub-mesh group reduces over exactly the expected peers."""
import pytest

from npudist.plan.ranks import group_ranks, rank_coordinates
from npudist.plan.schema import ParallelDegrees

from .dist_helpers import run_ranks

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("plan_mesh")]


def _check_mesh(rank, world, degrees, device_type):
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _world

    from npudist import mesh as M

    before = len(_world.pg_map)
    mesh = M.build_mesh(degrees, device_type)
    created = len(_world.pg_map) - before
    names = tuple(mesh.mesh_dim_names)
    coords = {n: M.dim_rank(mesh, n) for n in M.MESH_DIM_NAMES}
    sizes = {n: M.dim_size(mesh, n) for n in M.MESH_DIM_NAMES}
    peers = {}
    for name in M.MESH_DIM_NAMES + (M.DP_DIM, "ep", "edp"):
        sub = M.get_submesh(mesh, name)
        if sub is None:
            peers[name] = None
            continue
        t = torch.zeros(world, dtype=torch.int64, device=device_type)
        t[rank] = 1
        dist.all_reduce(t, group=sub.get_group())
        peers[name] = [i for i in range(world) if t[i].item()]
    fsdp = M.get_fsdp_mesh(mesh)
    return dict(names=names, coords=coords, sizes=sizes, peers=peers, created=created,
                fsdp=None if fsdp is None else tuple(fsdp.mesh_dim_names), dp_rank=M.dim_rank(mesh, M.DP_DIM),
                described=M.describe_mesh(mesh))


def _check_all(rank, world, cases, device_type):
    """Every case in one process group (spawning ranks is the slow part): build each mesh in turn."""
    from npudist.mesh import build_mesh
    out = [_check_mesh(rank, world, degrees, device_type) for degrees, _, _ in cases]
    try:
        build_mesh(ParallelDegrees(pp=1, dp_replicate=1, dp_shard=8, tp=1), device_type)
        wrong = None
    except ValueError as e:
        wrong = str(e)
    return out, wrong


WORLD = 4
CASES = [
    # degrees, expected mesh dims, expected new process groups per rank
    (ParallelDegrees(pp=1, dp_replicate=1, dp_shard=4, tp=1), ("dp_shard",), 0),   # reuses the default group
    (ParallelDegrees(pp=1, dp_replicate=1, dp_shard=2, tp=2), ("dp_shard", "tp"), 2),
    (ParallelDegrees(pp=2, dp_replicate=1, dp_shard=1, tp=2), ("pp", "tp"), 2),
    (ParallelDegrees(pp=2, dp_replicate=1, dp_shard=2, tp=1), ("pp", "dp_shard"), 2),
    # the flattened dp dim spans the whole world, so it reuses the default group
    (ParallelDegrees(pp=1, dp_replicate=2, dp_shard=2, tp=1), ("dp_replicate", "dp_shard"), 2),
    # context parallel: FSDP shards over dp_shard x cp (flattened: the whole world)
    (ParallelDegrees(pp=1, dp_replicate=1, dp_shard=2, tp=1, cp=2), ("dp_shard", "cp"), 2),
    # expert parallel borrows half of dp_shard: dp_shard splits into dp_shard_mod_ep x dp_shard_in_ep
    (ParallelDegrees(pp=1, dp_replicate=1, dp_shard=4, tp=1, ep=2), ("dp_shard_mod_ep", "dp_shard_in_ep"), 2),
    # ep = cp: the experts are split over the cp ranks, replicated over dp_shard
    (ParallelDegrees(pp=1, dp_replicate=1, dp_shard=2, tp=1, cp=2, ep=2), ("dp_shard_mod_ep", "cp"), 2),
    # HSDP x cp: a 2-D FSDP mesh (dp_replicate, cp)
    (ParallelDegrees(pp=1, dp_replicate=2, dp_shard=1, tp=1, cp=2), ("dp_replicate", "cp"), 2),
]


_RESULTS: dict = {}


@pytest.fixture(scope="module", params=[("gloo", "cpu"), ("hccl", "npu")], ids=["gloo-cpu", "hccl-npu"])
def mesh_results(request):
    backend, device = request.param
    if backend not in _RESULTS:
        _RESULTS[backend] = run_ranks(_check_all, WORLD, CASES, device, backend=backend, timeout=150)
    return _RESULTS[backend]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[str(c[0]) for c in CASES])
def test_mesh(case, mesh_results):
    degrees, dims, created = CASES[case]
    for rank, (all_cases, _) in enumerate(mesh_results):
        r = all_cases[case]
        assert r["names"] == dims
        assert r["created"] == created, f"rank {rank}: {r['created']} groups created, expected {created}"
        expected = rank_coordinates(degrees, rank)
        assert r["coords"] == expected
        assert r["sizes"] == degrees.sizes()
        for name in ("pp", "dp_replicate", "dp_shard", "cp", "tp"):
            if getattr(degrees, name) > 1:
                assert r["peers"][name] == group_ranks(degrees, name, rank)
            else:
                assert r["peers"][name] is None
        for name, size in (("ep", degrees.ep), ("edp", degrees.expert_dp if degrees.ep > 1 else 1)):
            assert r["peers"][name] == (group_ranks(degrees, name, rank) if size > 1 else None), name
        dp_peers = sorted({p for q in group_ranks(degrees, "dp_replicate", rank)
                           for p in group_ranks(degrees, "dp_shard", q)})
        assert r["peers"]["dp"] == (dp_peers if degrees.dp > 1 else None)
        assert r["dp_rank"] == expected["dp_replicate"] * degrees.dp_shard + expected["dp_shard"]
        shard_dims = tuple(n for n in r["names"] if n.startswith("dp_shard") or n == "cp")   # dp_shard x cp
        shard = ("dp_shard_cp",) if len(shard_dims) > 1 else shard_dims
        assert r["fsdp"] == ((("dp_replicate",) if degrees.dp_replicate > 1 else ()) + shard
                             if degrees.dp_shard * degrees.cp > 1 else None)


def test_mesh_rejects_wrong_world(mesh_results):
    for _, wrong in mesh_results:
        assert wrong and "multiply to 8 ranks but the process group has 4" in wrong
