"""Checkpoints reshard across context- and expert-parallel layouts (torch.distributed.checkpoint): a save at
ep2 x fsdp2 (experts split over ep, outside FSDP) resumes at ep1 x fsdp4, and a save at cp2 x fsdp2 resumes at
cp1 x fsdp4; the resumed steps' losses equal the uninterrupted run's. One spawned 4-rank process group."""
from __future__ import annotations

import json

import pytest

from _resume_cp_ep import RESUMES, SAVED_STEP, STEPS, worker
from _train_spawn import run_ranks
from npudist.data import default_corpus_path
from test_train_run import DEVICE

RTOL = 1e-5   # different layouts reduce in different orders (the parity tests' bound)


@pytest.mark.timeout(480)
def test_resume_across_cp_and_ep_layouts(tmp_path):
    corpus = default_corpus_path(cache_dir=str(tmp_path / "cache"))
    out = tmp_path / "result.json"
    run_ranks(worker, 4, (corpus, DEVICE, str(tmp_path / "ck"), str(out)), str(tmp_path), timeout=450)
    res = json.loads(out.read_text())
    full = res["uninterrupted"]
    assert all(len(v) == STEPS for v in full.values()), full
    for src, dst in RESUMES:
        # source and destination layouts train alike, and the resume continues the uninterrupted run
        assert all(abs(a - b) <= RTOL * abs(b) for a, b in zip(full[src], full[dst])), (src, dst, full)
        got, want = res["resumed"][f"{src}->{dst}"], full[src][SAVED_STEP:]
        assert len(got) == STEPS - SAVED_STEP, got
        assert all(abs(g - w) <= RTOL * abs(w) for g, w in zip(got, want)), (src, dst, got, want)
    assert full["ep2_fsdp2"][-1] < full["ep2_fsdp2"][0]
