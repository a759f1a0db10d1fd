"""CLI-style overrides (--a.b VALUE / --a.b=VALUE), parse_overrides and module-name patterns."""
import pytest

from npudist.plan import PlanError, load_plan, parse_overrides
from npudist.plan.patterns import matches, select_names

pytestmark = pytest.mark.timeout(60)


def test_both_override_styles():
    plan = load_plan({}, ["--parallel.tp_degree", "2", "--model.dim=64", "optimizer.lr=0.01"], world_size=4)
    assert plan.parallel.tp_degree == 2 and plan.parallel.dp_shard_degree == 2
    assert plan.model.dim == 64 and plan.optimizer.lr == 0.01


def test_override_beats_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("parallel:\n  tp_degree: 4\nmodel:\n  n_kv_heads: 2\n")
    plan = load_plan(str(f), ["--parallel.tp_degree=2", "--model.n_kv_heads", "null"], world_size=2)
    assert plan.parallel.tp_degree == 2 and plan.model.n_kv_heads is None


def test_override_values_are_yaml(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text")
    plan = load_plan({}, ["--optimizer.betas=[0.8, 0.9]", "--model.tie_embeddings", "true",
                          "--parallel.fsdp.wrap", "[layers.0, layers.1]", "--data.path", str(corpus)])
    assert plan.optimizer.betas == (0.8, 0.9) and plan.model.tie_embeddings is True
    assert plan.parallel.fsdp.wrap == ["layers.0", "layers.1"] and plan.data.path == str(corpus)


def test_override_into_mapping_keeps_dots_in_key():
    plan = load_plan({"parallel": {"tp": {"plan": {"output": "colwise"}}}},
                     ["--parallel.tp.plan.layers.*.attention.wq=colwise"])
    assert plan.parallel.tp.plan == {"output": "colwise", "layers.*.attention.wq": "colwise"}


def test_override_is_validated():
    with pytest.raises(PlanError) as info:
        load_plan({}, ["--parallel.tp_degree", "3", "--data.seq_lenn=3", "--model.dim", "wide"], world_size=4)
    errs = info.value.errors
    assert errs[0].startswith("data.seq_lenn: unknown key in override") and 'did you mean "seq_len"' in errs[0]
    assert any(e.startswith("model.dim: expected an integer") for e in errs)
    assert any(e.startswith("parallel.dp_shard_degree: -1 cannot be filled") for e in errs)


def test_override_through_a_scalar_is_an_error():
    with pytest.raises(PlanError, match=r"model.dim: is not a section"):
        load_plan({}, ["--model.dim.x=1"])


def test_override_without_value():
    with pytest.raises(PlanError, match="override has no value"):
        load_plan({}, ["--parallel.tp_degree"])
    with pytest.raises(PlanError, match="override has no value"):
        load_plan({}, ["--parallel.tp_degree", "--model.dim=64"])


def test_parse_overrides_splits_argv():
    argv = ["--config", "plan.yaml", "--parallel.tp_degree", "2", "--model.dim=64", "--steps", "3",
            "--not_a_section.x", "1", "positional"]
    overrides, rest = parse_overrides(argv)
    assert overrides == ["--parallel.tp_degree=2", "--model.dim=64"]
    assert rest == ["--config", "plan.yaml", "--steps", "3", "--not_a_section.x", "1", "positional"]


def test_load_plan_accepts_plan_object():
    plan = load_plan({"model": {"dim": 64}})
    again = load_plan(plan, ["--model.n_layers=2"])
    assert again.model.dim == 64 and again.model.n_layers == 2 and plan.model.n_layers == 4


@pytest.mark.parametrize("pattern,name,hit", [
    ("layers.*", "layers.0", True),
    ("layers.*", "layers.0.attention", False),
    ("layers.*.attention.w[qkv]", "layers.12.attention.wk", True),
    ("layers.*.attention.w[qkv]", "layers.12.attention.wo", False),
    ("**.wq", "layers.3.attention.wq", True),
    ("**.wq", "wq", True),
    ("layers.1*", "layers.10", True),
    ("output", "output", True),
    ("output", "layers.0.output", False),
])
def test_patterns(pattern, name, hit):
    assert matches(pattern, name) is hit


def test_select_names_keeps_order():
    names = ["tok_embeddings", "layers.0", "layers.0.attention", "layers.1", "norm"]
    assert list(select_names(["layers.*", "norm"], names)) == ["layers.0", "layers.1", "norm"]
