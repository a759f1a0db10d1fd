"""Malformed plans, in process: non-finite numbers, a file that is not UTF-8, a model larger than the devices."""
from __future__ import annotations

import pytest

from npudist import cli
from npudist.launch.plan_check import check_plan_args
from npudist.plan import PlanError, load_plan
from npudist.plan.check import capacity_warnings

pytestmark = pytest.mark.timeout(60)

PLAN = "examples/plans/fsdp_tp.yaml"


@pytest.mark.parametrize("key,raw,shown", [("optimizer.lr", ".nan", "nan"), ("optimizer.lr", ".inf", "inf"),
                                           ("optimizer.lr", "1e999", "'1e999'"),
                                           ("training.max_grad_norm", "-.inf", "-inf"),
                                           ("optimizer.eps", ".NaN", "nan")])
def test_non_finite_numbers_are_rejected(key, raw, shown):
    with pytest.raises(PlanError) as e:
        load_plan(PLAN, [f"--{key}", raw], world_size=4)
    assert e.value.errors == [f"{key}: expected a finite number, got {shown}"]


def test_a_plan_that_is_not_utf8_is_a_plan_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model:\n  name: llama  # caf\xe9\n".encode("latin-1"))
    with pytest.raises(PlanError) as e:
        load_plan(str(path))
    assert e.value.errors == [f"{path}: not UTF-8 text (byte 0xe9 at offset 27); a plan is a YAML file in UTF-8: "
                              "save it as UTF-8 or give the right file"]
    assert check_plan_args(["--config", str(path)], 1).errors == e.value.errors   # npurun reports it once


def test_an_estimate_beyond_the_device_memory_is_a_warning_not_an_error(capsys, monkeypatch):
    huge = ["--model.dim", str(2**40)]
    plan = load_plan(PLAN, huge, world_size=4)                     # valid
    warnings = capacity_warnings(plan, plan.parallel.degrees(), capacity=16 << 30)
    assert len(warnings) == 1 and warnings[0].startswith("warning: every rank needs more memory than an npu device "
                                                         "has (16.00 GiB, NPUDIST_DEVICE_MEMORY): rank 0 an estimated")
    small = load_plan(PLAN, world_size=4)
    assert capacity_warnings(small, small.parallel.degrees(), capacity=16 << 30) == []
    cpu = load_plan(PLAN, huge + ["--training.device", "cpu", "--training.backend", "gloo"], world_size=4)
    assert capacity_warnings(cpu, cpu.parallel.degrees(), capacity=16 << 30) == []
    found: list[str] = []
    assert check_plan_args(["--config", PLAN, *huge], 4, found) is None and found == warnings
    monkeypatch.delenv("NPUDIST_DEVICE_MEMORY", raising=False)
    assert cli.main(["plan", "check", PLAN, "-n", "4", *huge]) == 0
    assert capsys.readouterr().err.startswith("warning: every rank needs more memory")
    monkeypatch.setenv("NPUDIST_DEVICE_MEMORY", "lots")
    assert cli.main(["plan", "check", PLAN, "-n", "4"]) == 2
    assert capsys.readouterr().err.startswith("NPUDIST_DEVICE_MEMORY='lots' is not a positive size")
