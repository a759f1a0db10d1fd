"""The torch-free Llama layout and per-rank parameter estimate agree with the real model and with what the
real wrappers (npudist.parallelize over build_mesh, gloo) leave on each rank."""
import pytest

from npudist.plan import load_plan
from npudist.plan.estimate import estimate_rank
from npudist.plan.llama_layout import count_params, module_names, param_shapes

from .dist_helpers import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("plan_mesh")]

MODEL = {"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden_dim": 128, "max_seq_len": 64}


@pytest.mark.parametrize("tied", [False, True])
def test_layout_matches_real_model(tied):
    models = pytest.importorskip("npudist.models")
    cfg = load_plan({"model": {**MODEL, "tie_embeddings": tied}, "data": {"seq_len": 32}}).model
    model = models.build_model(cfg)
    assert module_names(cfg) == [n for n, _ in model.named_modules() if n]
    real = {n: tuple(p.shape) for n, p in model.named_parameters()}   # named_parameters dedups tied weights
    assert real == param_shapes(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


def _local_params(rank, world, plan_dict):
    import torch
    from torch.distributed.tensor import DTensor

    from npudist.mesh import build_mesh
    from npudist.models import build_model
    from npudist.parallelize import parallelize

    plan = load_plan(plan_dict, world_size=world)
    mesh = build_mesh(plan.parallel, "cpu")
    torch.manual_seed(0)
    pm = parallelize(build_model(plan.model), plan, mesh)
    local = {n: (p.to_local() if isinstance(p, DTensor) else p).numel() for n, p in pm.named_parameters()}
    return sum(local.values()), sorted({int(n.split(".")[1]) for n in local if n.startswith("layers.")})


LAYOUTS = {
    "fsdp2_tp2": {"dp_shard_degree": 2, "tp_degree": 2},
    "pp2_fsdp2": {"pp_degree": 2, "dp_shard_degree": 2, "pp": {"microbatches": 2}},
    "pp2_interleaved": {"pp_degree": 2, "dp_shard_degree": 1,
                        "pp": {"schedule": "Interleaved1F1B", "virtual_stages": 2, "microbatches": 2}},
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_estimate_matches_parallelized_model(name):
    pytest.importorskip("npudist.parallelize")
    parallel = LAYOUTS[name]
    plan_dict = {"model": MODEL, "training": {"device": "cpu"}, "parallel": parallel,
                 "data": {"seq_len": 32, "micro_batch_size": 2, "global_batch_size": 4}}
    world = 4 if name != "pp2_interleaved" else 2
    plan = load_plan(plan_dict, world_size=world)
    degrees = plan.parallel.degrees()
    results = run_ranks(_local_params, world, plan_dict, timeout=200)
    for rank, (numel, layers) in enumerate(results):
        est = estimate_rank(plan, degrees, rank)
        assert est.layers == layers, f"rank {rank}"
        assert est.params == numel, f"rank {rank}: estimate {est.params} vs real {numel}"
