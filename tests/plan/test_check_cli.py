"""`npudist plan check`: every shipped example is valid for its documented world size; the report shows the
mesh, per-rank placement and memory; invalid plans exit 2 with every error listed."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from npudist.cli import main
from npudist.plan import load_plan
from npudist.plan.check import check_plan, count_params, report_dict
from npudist.plan.estimate import estimate_all
from npudist.plan.ranks import rank_coordinates

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLANS = sorted(glob.glob(os.path.join(ROOT, "examples", "plans", "*.yaml")))
EXPECTED = {"fsdp", "tp", "pp_1f1b", "pp_interleaved", "fsdp_tp", "pp_fsdp", "3d", "hf_llama_fsdp_tp", "hf_qwen2_pp",
            "user_module"}
# user_module.yaml names examples/user_model.py, which examples/train.py imports from its own directory.
if os.path.join(ROOT, "examples") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "examples"))


def documented_world_size(path):
    """The --nproc of the `npurun` line in the plan's header comment."""
    header = open(path).read().split("\n\n")[0]
    m = re.search(r"npurun --nproc (\d+)", header)
    assert m, f"{path}: header must show how to run it (npurun --nproc N ...)"
    return int(m.group(1))


def test_all_example_plans_present():
    assert EXPECTED <= {os.path.basename(p)[:-5] for p in PLANS}


@pytest.mark.parametrize("path", PLANS, ids=os.path.basename)
def test_example_plan_is_valid_and_documented(path):
    text = open(path).read()
    assert text.startswith("# "), "each plan starts with a header comment"
    world = documented_world_size(path)
    assert f"plan check examples/plans/{os.path.basename(path)} --world-size {world}" in text
    plan, degrees, report = check_plan(path, world)
    assert degrees.world_size == world
    assert f"valid for {world} rank" in report
    assert plan.training.device == "npu"


def test_main_job_is_2d_on_4_ranks():
    plan = load_plan(os.path.join(ROOT, "examples/plans/fsdp_tp.yaml"), world_size=4)
    d = plan.parallel.degrees()
    assert (d.dp_shard, d.tp, d.pp, d.dp_replicate) == (2, 2, 1, 1)


def test_report_rank_placement_3d(capsys):
    path = os.path.join(ROOT, "examples/plans/3d.yaml")
    assert main(["plan", "check", path, "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "mesh      pp=2 x dp_shard=2 x tp=2 on npu" in out
    assert "tp            groups [0,1] [2,3] [4,5] [6,7]" in out
    assert "pp            groups [0,4] [1,5] [2,6] [3,7]" in out
    rows = [l.split() for l in out.splitlines() if re.match(r"\s+\d+\s+\d", l)]
    assert len(rows) == 8
    for row in rows:
        rank = int(row[0])
        c = rank_coordinates(load_plan(path, world_size=8).parallel.degrees(), rank)
        assert row[1] == str(c["pp"])                            # stage = pp coordinate
        assert row[2] == ("0-1+emb" if c["pp"] == 0 else "2-3+head")
        assert row[4] == f"{c['dp_shard']}/2" and row[5] == f"{c['tp']}/2"


def test_memory_estimate_shards_parameters():
    """Sharding over tp x dp_shard divides every rank's parameter elements (up to padding); the pipeline
    splits them by stage; the sum over the ranks of one replica group is the whole model."""
    base = {"model": {"dim": 128, "n_layers": 4, "n_heads": 4, "ffn_hidden_dim": 384},
            "data": {"micro_batch_size": 4, "global_batch_size": 16}}
    total = count_params(load_plan(base).model)

    def per_rank(parallel, world):
        plan = load_plan({**base, "parallel": parallel}, world_size=world)
        return plan, estimate_all(plan, plan.parallel.degrees())

    _, single = per_rank({}, 1)
    assert single[0].params == total and single[0].gather_bytes == 0
    assert single[0].optim_bytes == 2 * single[0].param_bytes == 8 * total

    _, fsdp = per_rank({"dp_shard_degree": 4}, 4)
    assert sum(e.params for e in fsdp) == pytest.approx(total, rel=1e-3)
    assert fsdp[0].gather_bytes > 0

    _, tp = per_rank({"tp_degree": 2}, 2)
    norms = (2 * 4 + 1) * 128            # replicated RMSNorm weights
    assert tp[0].params == (total - norms) // 2 + norms

    _, pp = per_rank({"pp_degree": 2, "pp": {"microbatches": 2}}, 2)
    assert pp[0].params + pp[1].params == total
    assert pp[0].holds_embedding and not pp[0].holds_head and pp[1].holds_head
    assert pp[0].blocks == [0, 1] and pp[1].blocks == [2, 3]


def test_memory_estimate_activation_knobs():
    base = {"model": {"n_layers": 4}, "data": {"micro_batch_size": 4, "global_batch_size": 8}}

    def act(parallel, world=1):
        plan = load_plan({**base, "parallel": parallel}, world_size=world)
        return [e.activation_bytes for e in estimate_all(plan, plan.parallel.degrees())]

    none, full = act({})[0], act({"activation_checkpoint": {"mode": "full"}})[0]
    assert full < none
    gpipe = act({"pp_degree": 2, "pp": {"schedule": "GPipe", "microbatches": 4}}, 2)
    f1b1 = act({"pp_degree": 2, "pp": {"schedule": "1F1B", "microbatches": 4}}, 2)
    assert f1b1[0] < gpipe[0]          # 1F1B keeps pp (2) microbatches alive on stage 0, GPipe all 4
    sp = act({"tp_degree": 2, "tp": {"sequence_parallel": True}}, 2)[0]
    nosp = act({"tp_degree": 2}, 2)[0]
    assert sp < nosp


def test_invalid_plan_exit_2_lists_all_errors(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text("parallel:\n  tp_degre: 2\n  pp_degree: 2\n  pp:\n    microbatches: 1\nmodel:\n  n_layers: 3\n")
    assert main(["plan", "check", str(f), "--world-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "3 errors" in err
    for key in ("parallel.tp_degre:", "parallel.pp.microbatches:", "model.n_layers:"):
        assert key in err


def test_world_size_needed_for_rest_degree(capsys):
    assert main(["plan", "check", os.path.join(ROOT, "examples/plans/fsdp.yaml")]) == 2
    assert "pass --world-size" in capsys.readouterr().err


def test_overrides_and_unknown_args(capsys):
    path = os.path.join(ROOT, "examples/plans/fsdp_tp.yaml")
    assert main(["plan", "check", path, "-n", "8", "--parallel.dp_shard_degree", "-1"]) == 0
    assert "dp_shard=4 x tp=2" in capsys.readouterr().out
    assert main(["plan", "check", path, "-n", "4", "--frobnicate"]) == 2
    assert "unrecognized arguments: --frobnicate" in capsys.readouterr().err


def test_json_report(capsys):
    path = os.path.join(ROOT, "examples/plans/pp_fsdp.yaml")
    assert main(["plan", "check", path, "--world-size", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mesh"] == {"pp": 2, "dp_shard": 2}
    assert [r["stages"] for r in data["ranks"]] == [[0], [0], [1], [1]]
    plan, degrees, _ = check_plan(path, 4)
    assert data == json.loads(json.dumps(report_dict(plan, degrees)))


def test_python_dash_m_entry_point():
    """`python -m npudist` runs the same CLI (checked in a fresh interpreter)."""
    path = os.path.join(ROOT, "examples/plans/tp.yaml")
    proc = subprocess.run([sys.executable, "-m", "npudist", "plan", "check", path, "--world-size", "3"],
                          capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "parallel.dp_shard_degree: -1 cannot be filled" in proc.stderr


def test_docs_cover_every_schema_key():
    """docs/plans.md documents every field of every plan dataclass (so the reference cannot drift)."""
    import dataclasses

    from npudist.plan.convert import field_types
    from npudist.plan.schema import Plan
    doc = open(os.path.join(ROOT, "docs", "plans.md")).read()

    def walk(cls):
        for name, tp in field_types(cls).items():
            if dataclasses.is_dataclass(tp):
                yield from walk(tp)
            else:
                yield name
    from npudist.models import MoEConfig   # a model spec's own config fields are documented too
    missing = [n for n in [*walk(Plan), *walk(MoEConfig)] if f"`{n}`" not in doc and f"`optimizer.{n}`" not in doc
               and not any(f"`{s}.{n}`" in doc for s in Plan.SECTIONS)]
    assert not missing, f"docs/plans.md lacks {missing}"
    for path in PLANS:
        assert f"`{os.path.basename(path)}`" in doc
