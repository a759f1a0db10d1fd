"""Checkpoint and resume through examples/train.py: a run resumed from step 2 continues exactly like the
uninterrupted run (same losses), under FSDP and under a 2-stage pipeline, on 2 ranks."""
from __future__ import annotations

import json
import os

import pytest

from test_train_run import _run

LAYOUTS = {"fsdp": [], "pp": ["--parallel.pp_degree", "2", "--parallel.dp_shard_degree", "1"]}


def _losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path))}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_resume_matches_uninterrupted_run(tmp_path, layout):
    folder = tmp_path / "ck"
    common = [*LAYOUTS[layout], "--checkpoint.enable_checkpoint", "true", "--checkpoint.folder", str(folder),
              "--checkpoint.interval", "2"]
    full = _run(tmp_path, common, nproc=2, steps=4, lr=1e-2)
    assert full.returncode == 0, full.stderr[-3000:]
    want = _losses(tmp_path / "m.jsonl")
    assert sorted(os.listdir(folder)) == ["step-2", "step-4"]
    assert os.path.exists(folder / "step-2" / ".metadata")
    os.remove(tmp_path / "m.jsonl")   # the metrics file is appended to

    resumed = _run(tmp_path, [*common, "--checkpoint.load_step", "2"], nproc=2, steps=4, lr=1e-2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "step-2" in resumed.stdout
    got = _losses(tmp_path / "m.jsonl")
    assert sorted(got) == [3, 4], got
    for step in (3, 4):
        assert abs(got[step] - want[step]) <= 1e-6 * abs(want[step]), (step, got[step], want[step])


@pytest.mark.timeout(120)
def test_missing_checkpoint_is_a_clear_error(tmp_path):
    res = _run(tmp_path, ["--checkpoint.enable_checkpoint", "true", "--checkpoint.folder", str(tmp_path / "none"),
                          "--checkpoint.load_step", "3"], steps=4, lr=1e-2)
    assert res.returncode != 0
    assert "checkpoint.load_step=3" in res.stderr + res.stdout and "no complete checkpoint" in res.stderr + res.stdout
