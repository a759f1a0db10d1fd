"""Runtime misuse and examples/train.py's user errors, in process: a message and exit code 2, no traceback."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

pytestmark = pytest.mark.timeout(60)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAN = os.path.join(REPO, "examples", "plans", "fsdp_tp.yaml")


def _train_main():
    spec = importlib.util.spec_from_file_location("train_example", os.path.join(REPO, "examples", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_train_reports_a_plan_error_in_full_on_rank0_and_its_first_line_elsewhere(monkeypatch, capsys):
    main = _train_main()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    assert main(["--config", PLAN, "--parallel.tp_degree", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: invalid plan {PLAN} for") or err.startswith(f"error: invalid plan {PLAN}:")
    assert err.strip().endswith("(the whole report: rank 0)") and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("RANK", "0")
    assert main(["--config", PLAN, "--parallel.tp_degree", "3"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) > 2 and "Traceback" not in "\n".join(lines)


def test_train_reports_a_malformed_launcher_variable_and_a_missing_plan(monkeypatch, capsys):
    main = _train_main()
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert main(["--config", PLAN]) == 2
    assert capsys.readouterr().err.startswith("error: WORLD_SIZE='two' is not an integer")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert main(["--config", "no_such_plan.yaml", "--verbose"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid plan no_such_plan.yaml") and "Traceback" in err   # --verbose


def test_device_misuse_names_the_problem():
    with pytest.raises(ValueError, match="npu device index 99"):
        torch.ones(1, device="npu:99")
    with pytest.raises(ValueError, match="monitored_barrier: timeout must be a positive"):
        import npudist.hccl
        npudist.hccl.monitored_barrier(timeout=-1)
