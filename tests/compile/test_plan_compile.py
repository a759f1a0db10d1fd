"""The plan's ``compile`` section: validation (names the bad key and the fix, changes nothing) and how
``parallelize`` applies it (which modules, names kept, same training math), in one process."""
import dataclasses
import os
import sys

import pytest
import torch

from npudist.models import build_model
from npudist.parallelize import parallelize
from npudist.plan import PlanError, load_plan, validate_plan

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("compile")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {"model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden_dim": 64, "max_seq_len": 16},
        "data": {"seq_len": 16, "global_batch_size": 2, "micro_batch_size": 2},
        "training": {"device": "npu"}}


def _errors(data, overrides=()):
    with pytest.raises(PlanError) as info:
        load_plan(data, overrides, world_size=1)
    return info.value.errors


def test_defaults_disable_compile_and_torchtitan_shape_loads():
    assert load_plan({}, world_size=1).compile.enable is False
    plan = load_plan({"compile": {"enable": True, "components": ["model"]}}, world_size=1)
    assert plan.compile.enable and plan.compile.components == ["model"] and plan.compile.backend == "inductor"
    plan = load_plan({}, ["--compile.enable", "true", "--compile.components", "[loss]"], world_size=1)
    assert plan.compile.enable and plan.compile.components == ["loss"]


@pytest.mark.parametrize("section, key, fragment", [
    ({"enabled": True}, "compile.enabled", 'did you mean "enable"'),
    ({"enable": True, "components": ["modle"]}, "compile.components[0]", 'did you mean "model"'),
    ({"enable": True, "components": []}, "compile.components", "compile nothing"),
    ({"enable": True, "components": ["loss", "loss"]}, "compile.components[1]", "listed twice"),
    ({"enable": True, "backend": "indcutor"}, "compile.backend", 'did you mean "inductor"'),
    ({"enable": "yes"}, "compile.enable", "true or false"),
])
def test_bad_compile_section_names_key_and_fix(section, key, fragment):
    (err,) = _errors({"compile": section})
    assert err.startswith(key + ": ") and fragment in err, err


def test_model_without_blocks_cannot_compile_model_but_can_compile_loss():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        model = {"name": "module", "module": "user_model:build_model", "dim": 32, "n_layers": 1,
                 "ffn_hidden_dim": 64, "max_seq_len": 128}
        (err,) = _errors({"model": model, "compile": {"enable": True}})
        assert err.startswith("compile.components: model: the module model's spec names no blocks"), err
        assert "compile only the loss" in err
        load_plan({"model": model, "compile": {"enable": True, "components": ["loss"]}}, world_size=1)
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))


def test_validation_does_not_change_the_plan():
    plan = load_plan({"compile": {"enable": True, "components": ["model", "loss"]}}, world_size=1)
    before = dataclasses.asdict(plan)
    assert validate_plan(plan, world_size=1) == []
    assert dataclasses.asdict(plan) == before


def _train_step(pm, tokens):
    loss = pm.loss_fn(pm.parts[0](tokens), tokens)
    loss.backward()
    return loss.detach()


def test_parallelize_compiles_each_block_and_the_loss_keeping_names_and_math():
    """Backend "eager" (Dynamo capture, no code generation) keeps this cheap; the Inductor path is covered by
    test_plan_compile_npurun.py. Parameter names stay the eager model's (checkpoints, optimizer state)."""
    import torch._dynamo

    torch._dynamo.reset()
    eager_plan = load_plan(TINY, world_size=1)
    plan = load_plan({**TINY, "compile": {"enable": True, "backend": "eager"}}, world_size=1)
    torch.manual_seed(0)
    eager = parallelize(build_model(eager_plan.model), eager_plan, None)
    torch.manual_seed(0)
    pm = parallelize(build_model(plan.model), plan, None)
    assert eager.compiled == [] and pm.compiled == ["layers.0", "layers.1", "loss"]
    assert [n for n, _ in pm.named_parameters()] == [n for n, _ in eager.named_parameters()]
    blocks = pm.parts[0].layers
    assert all("forward" in vars(b) for b in blocks.values())   # the forward is compiled, not the module wrapped
    tokens = torch.randint(0, 256, (2, 16), device="npu")
    torch.testing.assert_close(_train_step(pm, tokens), _train_step(eager, tokens), rtol=0, atol=0)
    for (name, p), q in zip(pm.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2   # a block graph and the loss graph
    with pytest.raises(ValueError, match="already replaced"):
        from npudist.compile.apply import apply_compile
        apply_compile(pm.parts[0], plan.compile, ["layers.0"])


def test_compiled_blocks_with_activation_checkpointing_are_rejected_with_the_fix():
    """Absent, not half-working: Dynamo cannot trace the block's checkpoint call (measured, docs/compile.md)."""
    ac = {"parallel": {"activation_checkpoint": {"mode": "full"}}}
    (err,) = _errors({**TINY, **ac, "compile": {"enable": True}})
    assert err.startswith("compile.components: model: compiling blocks under parallel.activation_checkpoint")
    assert "set activation_checkpoint.mode: none or compile only the loss" in err
    load_plan({**TINY, **ac, "compile": {"enable": True, "components": ["loss"]}}, world_size=1)
