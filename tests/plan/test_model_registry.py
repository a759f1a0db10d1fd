"""The plan layer knows models only through the registry of model specs: a newly registered spec is accepted
by name with its own block paths (pipeline split points, activation swap, levers, plan check), and every
message that lists model names lists the registered specs, the new one included."""
import pytest

import npudist.models.spec as spec_registry
from npudist.models import ModelLayout, ModelSpec, TransformerDims, model_spec_names, register_model_spec
from npudist.plan import PlanError, load_plan
from npudist.plan.check import check_plan
from npudist.plan.levers import memory_levers

pytestmark = pytest.mark.timeout(60)

NAME = "toy_plugin"
N_BLOCKS = 4
DIM = 32
VOCAB = 256


def _toy_layout(cfg) -> ModelLayout:
    """Block paths that no built-in model uses ("trunk.N"), so a hint naming them can only come from here."""
    blocks = tuple(f"trunk.{i}" for i in range(N_BLOCKS))
    modules = ("embed", "trunk", *(m for b in blocks for m in (b, f"{b}.mix")), "head")
    params = {"embed.weight": (VOCAB, DIM), **{f"{b}.mix.weight": (DIM, DIM) for b in blocks},
              "head.weight": (VOCAB, DIM)}
    return ModelLayout(modules=modules, params=params, blocks=blocks, first=("embed",), last=("head",),
                       head="head", dims=TransformerDims(dim=DIM, q_width=DIM, kv_width=DIM, ffn_hidden=DIM,
                                                         vocab_size=VOCAB))


def _never_built(cfg):
    raise AssertionError("checking a plan must not build the model")


def _toy_variant(cfg) -> str:
    return f"toy of width {cfg.dim}"


@pytest.fixture
def toy_spec(monkeypatch):
    """A plug-in spec registered for one test: the registry (and its layout cache) are swapped for copies
    that monkeypatch puts back, so other tests see only the built-in specs."""
    monkeypatch.setattr(spec_registry, "_SPECS", dict(spec_registry._SPECS))
    monkeypatch.setattr(spec_registry, "_LAYOUTS", {})
    return register_model_spec(ModelSpec(
        name=NAME, build=_never_built, layout=_toy_layout, fsdp_units=("trunk.*",), supports_pipeline=True,
        supports_context_parallel=True, variant=_toy_variant, description="a plug-in used by the plan tests"))


def _errors(data, world_size=None):
    with pytest.raises(PlanError) as info:
        load_plan(data, world_size=world_size)
    return info.value.errors


def test_a_registered_spec_is_accepted_with_its_own_block_paths(toy_spec):
    plan = load_plan({"model": {"name": NAME},
                      "parallel": {"pp_degree": 2, "pp": {"split_points": ["trunk.1"]}}}, world_size=2)
    assert plan.model.name == NAME
    assert plan.parallel.pp.split_points == [1]
    plan = load_plan({"model": {"name": NAME}, "memory": {"swap": {"activations": {"blocks": ["trunk.*"]}}}},
                     world_size=1)
    assert plan.memory.swap.activations.blocks == ["trunk.*"]


def test_block_hints_use_the_spec_block_paths(toy_spec):
    errs = _errors({"model": {"name": NAME}, "memory": {"swap": {"activations": {"blocks": ["layers.*"]}}}},
                   world_size=1)
    assert errs == ["memory.swap.activations.blocks[0]: 'layers.*' matches none of the model's blocks "
                    "(trunk.0, trunk.1, trunk.2, ...); give a block index, a block name or a pattern such as "
                    "'trunk.*'"]
    errs = _errors({"model": {"name": NAME}, "parallel": {"pp_degree": 2, "pp": {"split_points": ["layers.2"]}}},
                   world_size=2)
    assert errs == ["parallel.pp.split_points[0]: expected a block index or a block name (trunk.N), got "
                    "'layers.2'"]


def test_plan_check_describes_the_spec_through_the_spec(toy_spec):
    plan, degrees, text = check_plan({"model": {"name": NAME, "dim": 48}}, world_size=2)
    assert f"model     {NAME} (toy of width 48): " in text
    assert "fsdp      units trunk.* + root" in text
    settings = [lever.setting for lever in memory_levers(plan, degrees, 0)]
    assert "memory.swap.activations.blocks: ['trunk.*']" in settings


def test_unknown_name_lists_every_registered_spec(toy_spec):
    errs = _errors({"model": {"name": "no_such_model"}})
    assert len(errs) == 1 and errs[0].startswith("model.name: 'no_such_model' is not a registered model spec")
    registered = errs[0].split("registered: ", 1)[1]
    for name in model_spec_names():
        assert name in registered, (name, errs[0])
    assert NAME in registered


def test_capability_lists_name_the_registered_spec(toy_spec):
    register_model_spec(ModelSpec(name="toy_sequential", build=_never_built, layout=_toy_layout))
    errs = _errors({"model": {"name": "toy_sequential"}, "parallel": {"cp_degree": 2}, "data": {"seq_len": 32}},
                   world_size=2)
    assert len(errs) == 1 and errs[0].startswith("parallel.cp_degree: the toy_sequential model does not support "
                                                 "context parallelism"), errs
    listed = errs[0].rsplit("(model.name: ", 1)[1].rstrip(")").split(", ")
    assert NAME in listed and "toy_sequential" not in listed


def test_without_the_plugin_the_name_is_unknown():
    assert NAME not in model_spec_names()
    errs = _errors({"model": {"name": NAME}})
    assert errs[0].startswith(f"model.name: {NAME!r} is not a registered model spec")
