"""Context- and expert-parallel plans: degrees, validation (every error at once, the fix named), the moe model
spec's own config fields, rank groups and the `plan check` report / memory estimate. No processes."""
import pytest

from npudist.models import MoEConfig, build_model, model_layout
from npudist.plan import PlanError, load_plan
from npudist.plan.check import check_plan
from npudist.plan.estimate import estimate_all
from npudist.plan.ranks import group_ranks
from npudist.plan.schema import ParallelDegrees

pytestmark = pytest.mark.timeout(60)

MOE = {"name": "moe", "dim": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden_dim": 64,
       "max_seq_len": 128, "n_experts": 4, "top_k": 2, "moe_hidden_dim": 16}


def errors_of(data, world_size=None, overrides=()):
    with pytest.raises(PlanError) as info:
        load_plan(data, overrides, world_size=world_size)
    return info.value.errors


def test_degrees_compose():
    plan = load_plan({"model": MOE, "data": {"seq_len": 32, "global_batch_size": 16},
                      "parallel": {"cp_degree": 2, "ep_degree": 4, "dp_replicate_degree": 2}}, world_size=16)
    d = plan.parallel.degrees()
    assert (d.dp_replicate, d.dp_shard, d.cp, d.ep, d.tp, d.pp) == (2, 4, 2, 4, 1, 1)
    assert d.world_size == 16 and d.dp == 8 and d.dp_shard_in_ep == 2 and d.expert_dp == 4


def test_bad_input_reports_every_error_with_its_fix():
    errs = errors_of({"model": {"name": "llama"}, "data": {"seq_len": 30},
                      "parallel": {"cp_degree": 2, "ep_degree": 2}}, world_size=4)
    assert len(errs) == 2, errs
    assert errs[0].startswith("data.seq_len: 30 is not divisible by 2 x parallel.cp_degree = 4")
    assert "use a multiple of 4" in errs[0]
    assert errs[1].startswith("parallel.ep_degree: the llama model has no experts")
    assert "(model.name: hf_causal_lm, moe)" in errs[1]


def test_ep_must_divide_experts_and_dp_shard_cp():
    errs = errors_of({"model": {**MOE, "n_experts": 6}, "data": {"seq_len": 32},
                      "parallel": {"ep_degree": 4}}, world_size=4)
    assert errs == ["parallel.ep_degree: the model's 6 experts cannot be split evenly over 4 ep ranks; use an "
                    "ep_degree dividing 6 or change model.n_experts"]
    errs = errors_of({"model": {**MOE, "n_experts": 8}, "data": {"seq_len": 32},
                      "parallel": {"ep_degree": 8, "cp_degree": 2}}, world_size=4)
    assert len(errs) == 1 and errs[0].startswith("parallel.ep_degree: 8 must divide dp_shard x cp = 2 x 2 = 4")
    errs = errors_of({"model": MOE, "data": {"seq_len": 32}, "parallel": {"ep_degree": 2, "cp_degree": 4}},
                     world_size=4)
    assert len(errs) == 1 and "be a multiple of cp_degree 4" in errs[0] and "use one of [4]" in errs[0]


def test_degree_minimums_and_ulysses_heads():
    errs = errors_of({"parallel": {"cp_degree": 0, "ep_degree": -1}})
    assert errs == ["parallel.cp_degree: must be >= 1, got 0", "parallel.ep_degree: must be >= 1, got -1"]
    errs = errors_of({"model": {"n_heads": 6, "dim": 96}, "data": {"seq_len": 32},
                      "parallel": {"cp_degree": 4, "cp": {"method": "ulysses"}}}, world_size=4)
    assert len(errs) == 1 and errs[0].startswith("model.n_heads: 6 heads cannot be split over parallel.cp_degree=4")
    errs = errors_of({"model": {"name": "hf_causal_lm"}, "data": {"seq_len": 32},
                      "parallel": {"cp_degree": 2, "cp": {"method": "sideways"}}}, world_size=2)
    assert any(e.startswith("parallel.cp.method: expected one of 'ring', 'ulysses'") for e in errs)


def test_cp_without_load_balance_needs_only_cp_chunks():
    load_plan({"data": {"seq_len": 6}, "model": {"max_seq_len": 8},
               "parallel": {"cp_degree": 2, "cp": {"load_balance": False}}}, world_size=2)
    errs = errors_of({"data": {"seq_len": 6}, "model": {"max_seq_len": 8}, "parallel": {"cp_degree": 2}},
                     world_size=2)
    assert len(errs) == 1 and errs[0].startswith("data.seq_len: 6")


def test_moe_spec_declares_its_own_fields():
    plan = load_plan({"model": MOE}, world_size=1)
    assert isinstance(plan.model, MoEConfig) and plan.model.n_experts == 4
    # the llama spec has no expert fields; an override may name the spec after its fields
    errs = errors_of({"model": {"n_experts": 4}})
    assert errs[0].startswith("model.n_experts: unknown key")
    plan = load_plan({}, ["--model.top_k", "1", "--model.name", "moe"], world_size=1)
    assert plan.model.top_k == 1
    errs = errors_of({"model": {**MOE, "top_k": 5, "n_dense_layers": 3}})
    assert errs == ["model.top_k: 5 exceeds model.n_experts=4",
                    "model.n_dense_layers: 3 leaves no MoE block of the 3 layers; use fewer dense layers"]


def test_moe_layout_matches_the_built_model():
    cfg = load_plan({"model": MOE}, world_size=1).model
    model, layout = build_model(cfg), model_layout(cfg)
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == layout.params
    assert set(layout.modules) == {n for n, _ in model.named_modules() if n}
    assert layout.params["layers.1.moe.experts.w1"] == (4, 16, 32)


def test_ep_and_edp_groups():
    d = ParallelDegrees(pp=1, dp_replicate=2, dp_shard=4, tp=1, cp=2, ep=4)
    # ranks: dp_replicate x dp_shard x cp; ep = 2 consecutive dp_shard coordinates x both cp coordinates
    assert group_ranks(d, "ep", 0) == [0, 1, 2, 3]
    assert group_ranks(d, "ep", 5) == [4, 5, 6, 7]
    assert group_ranks(d, "edp", 0) == [0, 4, 8, 12]
    assert group_ranks(d, "edp", 3) == [3, 7, 11, 15]


def test_check_report_and_memory_estimate():
    data = {"model": MOE, "data": {"seq_len": 64, "micro_batch_size": 2, "global_batch_size": 8}}
    _, _, text = check_plan({**data, "parallel": {"cp_degree": 2, "ep_degree": 2}}, world_size=4)
    assert "mesh      dp_shard=2 x cp=2 (ep=2 within dp_shard x cp)" in text
    assert "  ep            groups [0,1] [2,3]   (borrowed from dp_shard x cp)" in text
    assert "  edp           groups [0,2] [1,3]" in text
    assert "context   cp=2 ring, 32 of 64 tokens of every sequence per rank" in text
    assert "          activations of rank 0: " in text and "(without cp: " in text
    assert "experts   4 routed per MoE layer; 2 per rank (ep=2)" in text

    def estimate(parallel, world):
        plan = load_plan({**data, "parallel": parallel}, world_size=world)
        return estimate_all(plan, plan.parallel.degrees())[0]

    layout = model_layout(load_plan({"model": MOE}, world_size=1).model)
    experts = sum(n for name, shape in layout.params.items() if ".experts." in name
                  for n in [shape[0] * shape[1] * shape[2]])
    fsdp2, ep2 = estimate({"dp_shard_degree": 2}, 2), estimate({"dp_shard_degree": 2, "ep_degree": 2}, 2)
    assert fsdp2.params == pytest.approx(ep2.params, rel=1e-3)   # both halve the experts
    fsdp4, ep2_fsdp4 = estimate({"dp_shard_degree": 4}, 4), estimate({"dp_shard_degree": 4, "ep_degree": 2}, 4)
    assert ep2_fsdp4.params - fsdp4.params == pytest.approx(experts / 2 - experts / 4, rel=1e-2)
    cp1 = estimate({"dp_shard_degree": 1}, 1)
    cp2 = estimate({"cp_degree": 2, "cp": {"method": "ulysses"}, "dp_shard_degree": 1}, 2)
    assert cp2.activation_bytes < 0.6 * cp1.activation_bytes   # each rank holds half of every sequence


def test_moe_under_tp_needs_its_own_plan_and_a_divisible_shared_expert():
    base = {"model": {**MOE, "moe_hidden_dim": 15}, "data": {"seq_len": 32}}
    errs = errors_of({**base, "parallel": {"tp_degree": 2, "ep_degree": 2, "tp": {"plan": {"output": "colwise"}}}},
                     world_size=4)
    assert len(errs) == 2, errs
    assert errs[0].startswith("model.moe_hidden_dim: the shared expert's width 15")
    assert errs[1].startswith("parallel.tp.plan: the moe model runs only its built-in TP plan")
    load_plan({"model": MOE, "data": {"seq_len": 32}, "parallel": {"tp_degree": 2, "ep_degree": 2}}, world_size=4)


def test_check_report_shows_the_moe_tp_groups():
    _, _, text = check_plan({"model": MOE, "data": {"seq_len": 32},
                             "parallel": {"tp_degree": 2, "ep_degree": 2, "tp": {"sequence_parallel": True}}},
                            world_size=4)
    assert "mesh      dp_shard=2 x tp=2 (ep=2 within dp_shard x cp)" in text
    assert "  tp            groups [0,1] [2,3]" in text
    assert "  ep            groups [0,2] [1,3]   (borrowed from dp_shard x cp)" in text
    assert ("          tp groups [0,1] [2,3]: each tp rank routes its 16 of 32 tokens per sequence; router gate "
            "and experts replicated over tp (gradients summed)") in text
    layout = model_layout(load_plan({"model": MOE}, world_size=1).model)
    assert "layers.*.moe.shared_expert.w[123]" in layout.tp_sharded


HF_MOE = {"name": "hf_causal_lm", "hf_model_type": "qwen2_moe", "dim": 32, "n_layers": 2, "n_heads": 4,
          "n_kv_heads": 2, "ffn_hidden_dim": 64, "max_seq_len": 64,
          "hf_config": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                        "shared_expert_intermediate_size": 32}}


def test_hf_moe_plans_split_experts_and_a_dense_hf_model_has_none():
    _, _, text = check_plan({"model": HF_MOE, "data": {"seq_len": 32}, "parallel": {"ep_degree": 2}}, world_size=2)
    assert "experts   4 routed per MoE layer; 2 per rank (ep=2)" in text
    layout = model_layout(load_plan({"model": HF_MOE, "data": {"seq_len": 32}}, world_size=1).model)
    assert layout.experts == ("model.layers.0.mlp.experts", "model.layers.1.mlp.experts")
    dense = {**HF_MOE, "hf_model_type": "qwen2", "hf_config": None}
    errs = errors_of({"model": dense, "data": {"seq_len": 32}, "parallel": {"ep_degree": 2}}, world_size=2)
    assert errs == ["parallel.ep_degree: the hf_causal_lm model has no experts to split; set parallel.ep_degree: "
                    "1 or use a mixture-of-experts configuration of a model whose spec has routed experts "
                    "(model.name: hf_causal_lm, moe)"]
    errs = errors_of({"model": dense, "data": {"seq_len": 32}, "parallel": {"cp_degree": 2}}, world_size=2)
    assert errs == ["parallel.cp_degree: the hf_causal_lm model does not support context parallelism (its spec has "
                    "no sharded-sequence attention); set parallel.cp_degree: 1 or use a model whose spec supports "
                    "it (model.name: llama, moe)"]
    errs = errors_of({"model": HF_MOE, "data": {"seq_len": 32}, "parallel": {"ep_degree": 3}}, world_size=3)
    assert errs[0].startswith("parallel.ep_degree: the model's 4 experts cannot be split evenly over 3 ep ranks")
    errs = errors_of({"model": HF_MOE, "data": {"seq_len": 32},
                      "parallel": {"ep_degree": 2, "tp_degree": 2}}, world_size=4)
    assert ("parallel.ep_degree: expert parallel of an hf_causal_lm MoE model together with parallel.tp_degree > 1 "
            "is not supported; set one of them to 1") in errs, errs
