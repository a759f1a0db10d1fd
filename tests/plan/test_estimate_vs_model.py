"""The torch-free Llama layout (npudist.models.llama_spec) and per-rank parameter estimate agree with the real model and with what the
real wrappers (npudist.parallelize over build_mesh, gloo) leave on each rank."""
import pytest

from npudist.plan import load_plan
from npudist.plan.estimate import estimate_rank
from npudist.models.llama_spec import module_names, param_shapes
from npudist.plan.check import count_params

from .dist_helpers import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("plan_mesh")]

MODEL = {"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden_dim": 128, "max_seq_len": 64}


@pytest.mark.parametrize("tied", [False, True])
def test_layout_matches_real_model(tied):
    from npudist import models
    cfg = load_plan({"model": {**MODEL, "tie_embeddings": tied}, "data": {"seq_len": 32}}).model
    model = models.build_model(cfg)
    assert module_names(cfg) == [n for n, _ in model.named_modules() if n]
    real = {n: tuple(p.shape) for n, p in model.named_parameters()}   # named_parameters dedups tied weights
    assert real == param_shapes(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


def _local_params(rank, world, plan_dicts):
    """Parallelize the real model under every plan in one process group; local parameter elements and
    block indices per plan."""
    import torch
    from torch.distributed.tensor import DTensor

    from npudist.mesh import build_mesh
    from npudist.models import build_model
    from npudist.parallelize import parallelize

    out = []
    for plan_dict in plan_dicts:
        plan = load_plan(plan_dict, world_size=world)
        mesh = build_mesh(plan.parallel, "cpu")
        torch.manual_seed(0)
        pm = parallelize(build_model(plan.model), plan, mesh)
        local = {n: (p.to_local() if isinstance(p, DTensor) else p).numel() for n, p in pm.named_parameters()}
        out.append((sum(local.values()),
                    sorted({int(n.split(".")[1]) for n in local if n.startswith("layers.")})))
    return out


WORLD = 4
# Two layouts cover FSDP, TP, PP and interleaving in one process group (spawning ranks is the slow part).
LAYOUTS = {
    "fsdp2_tp2": {"dp_shard_degree": 2, "tp_degree": 2},
    "pp2_tp2_interleaved": {"pp_degree": 2, "tp_degree": 2, "dp_shard_degree": 1,
                            "pp": {"schedule": "Interleaved1F1B", "virtual_stages": 2, "microbatches": 2}},
}


def _plan_dict(parallel):
    return {"model": MODEL, "training": {"device": "cpu"}, "parallel": parallel,
            "data": {"seq_len": 32, "micro_batch_size": 2, "global_batch_size": 4}}


@pytest.fixture(scope="module")
def real_shards():
    pytest.importorskip("npudist.parallelize")
    return run_ranks(_local_params, WORLD, [_plan_dict(p) for p in LAYOUTS.values()], timeout=200)


@pytest.mark.parametrize("index,name", list(enumerate(LAYOUTS)), ids=list(LAYOUTS))
def test_estimate_matches_parallelized_model(index, name, real_shards):
    plan = load_plan(_plan_dict(LAYOUTS[name]), world_size=WORLD)
    degrees = plan.parallel.degrees()
    for rank, per_plan in enumerate(real_shards):
        numel, layers = per_plan[index]
        est = estimate_rank(plan, degrees, rank)
        assert est.blocks == layers, f"rank {rank}"
        assert est.params == numel, f"rank {rank}: estimate {est.params} vs real {numel}"
