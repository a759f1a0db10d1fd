"""Checkpoint and resume.

* Layout changes (in one spawned 2-rank process group, to keep CI time small): a save under FSDP x2, TP x2
  or PP x2 resumes under each other one (and an interleaved pipeline's save under FSDP), and the resumed
  steps' losses equal the uninterrupted run's; a resume with another global batch size is refused, naming
  both. Likewise across context- and expert-parallel layouts (one 4-rank group).
* Through examples/train.py under npurun: a rank killed in the middle of a save leaves the previous save as
  the one resumed, and the resumed run continues with the killed run's losses.
"""
from __future__ import annotations

import json
import os

import pytest

from _resume_cp_ep import RESUMES as CP_EP_RESUMES, worker as cp_ep_worker
from _resume_layouts import LAYOUTS, SAVED_STEP, STEPS, worker
from _train_spawn import run_ranks
from npudist.data import default_corpus_path
from test_train_run import DEVICE, _run

KILLER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kill_mid_save.py")

# Different layouts reduce in different orders: the parity tests' bound (1e-5 relative). A resume under the
# saving layout itself must reproduce the uninterrupted run bit for bit (the kill-during-save test).
CROSS_RTOL = 1e-5


def _close(got: float, want: float, rtol: float) -> bool:
    return abs(got - want) <= rtol * abs(want)


def _resume_results(tmp_path, layouts_worker, world: int) -> dict:
    """Run a resume worker (_resume_layouts / _resume_cp_ep) on ``world`` ranks; its JSON result."""
    corpus = default_corpus_path(cache_dir=str(tmp_path / "cache"))
    out = tmp_path / "result.json"
    run_ranks(layouts_worker, world, (corpus, DEVICE, str(tmp_path / "ck"), str(out)), str(tmp_path), timeout=450)
    res = json.loads(out.read_text())
    assert all(len(v) == STEPS for v in res["uninterrupted"].values()), res["uninterrupted"]
    return res


# About 40 s on an idle 2-core machine; the generous bound is for a machine shared with other jobs.
@pytest.mark.timeout(480)
def test_resume_under_every_layout_matches_uninterrupted_run(tmp_path):
    res = _resume_results(tmp_path, worker, 2)
    full = res["uninterrupted"]
    for layout, losses in full.items():   # the layouts themselves agree (as in the parity tests)
        assert all(_close(a, b, CROSS_RTOL) for a, b in zip(losses, full["fsdp"])), (layout, losses, full["fsdp"])
    assert full["fsdp"][-1] < full["fsdp"][0]
    assert len(res["resumed"]) == len(LAYOUTS) * (len(LAYOUTS) - 1) + 1
    for pair, got in res["resumed"].items():
        src, dst = pair.split("->")
        want = full[dst][SAVED_STEP:]
        assert len(got) == STEPS - SAVED_STEP and all(_close(g, w, CROSS_RTOL) for g, w in zip(got, want)), \
            (pair, got, want)
    refused = res["refused"]
    assert refused is not None, "a resume with another global batch size must be refused"
    assert "global_batch_size 8 -> 16" in refused and "step-2" in refused, refused


# Context and expert parallel: a save at ep2 x fsdp2 (experts split over ep, outside FSDP) resumes at
# ep1 x fsdp4, a save at cp2 x fsdp2 at cp1 x fsdp4 (4 ranks).
@pytest.mark.timeout(480)
def test_resume_across_cp_and_ep_layouts(tmp_path):
    res = _resume_results(tmp_path, cp_ep_worker, 4)
    full = res["uninterrupted"]
    for src, dst in CP_EP_RESUMES:
        # source and destination layouts train alike, and the resume continues the uninterrupted run
        assert all(_close(a, b, CROSS_RTOL) for a, b in zip(full[src], full[dst])), (src, dst, full)
        got, want = res["resumed"][f"{src}->{dst}"], full[src][SAVED_STEP:]
        assert len(got) == STEPS - SAVED_STEP and all(_close(g, w, CROSS_RTOL) for g, w in zip(got, want)), \
            (src, dst, got, want)
    assert full["ep2_fsdp2"][-1] < full["ep2_fsdp2"][0]


def _losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path))}


@pytest.mark.timeout(300)
def test_kill_during_save_resumes_from_the_previous_save(tmp_path):
    folder = tmp_path / "ck"
    common = ["--checkpoint.enable_checkpoint", "true", "--checkpoint.folder", str(folder),
              "--checkpoint.interval", "2"]
    killed = _run(tmp_path, common, nproc=2, steps=4, lr=1e-2, script=KILLER, env={"KILL_SAVE_STEP": "4"})
    assert killed.returncode == 1, (killed.returncode, killed.stderr[-3000:])
    assert "signal SIGKILL" in killed.stderr, killed.stderr[-3000:]
    uninterrupted = _losses(tmp_path / "m.jsonl")   # steps 1-4 were trained and logged before the save of 4
    assert sorted(uninterrupted) == [1, 2, 3, 4]
    assert sorted(os.listdir(folder)) == [".tmp-step-4", "step-2"], os.listdir(folder)
    assert not os.path.exists(folder / ".tmp-step-4" / ".metadata")
    os.remove(tmp_path / "m.jsonl")   # the metrics file is appended to

    resumed = _run(tmp_path, common, nproc=2, steps=4, lr=1e-2)   # load_step -1: the newest complete save
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {folder}/step-2" in resumed.stdout, resumed.stdout[-3000:]
    got = _losses(tmp_path / "m.jsonl")
    assert got == {3: uninterrupted[3], 4: uninterrupted[4]}, (got, uninterrupted)
    assert sorted(os.listdir(folder)) == ["step-2", "step-4"]   # the interrupted save was cleaned up and redone


@pytest.mark.timeout(120)
def test_missing_checkpoint_is_a_clear_error(tmp_path):
    res = _run(tmp_path, ["--checkpoint.enable_checkpoint", "true", "--checkpoint.folder", str(tmp_path / "none"),
                          "--checkpoint.load_step", "3"], steps=4, lr=1e-2)
    assert res.returncode != 0
    assert "checkpoint.load_step=3" in res.stderr + res.stdout and "no complete checkpoint" in res.stderr + res.stdout
