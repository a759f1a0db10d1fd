"""Checkpoints never lose what a run wrote, and a damaged save names itself.

In one process (a 1-rank gloo group, a tiny linear model on cpu): retention keeps the save a run has just
written even when the folder holds another run's higher steps; a fresh start into such a folder is refused
unless ``checkpoint.overwrite`` allows it; a truncated shard, a truncated ``.metadata`` and a shard with
garbage of the right size each name the file (or the save) and the step and offer the newest intact save,
which ``checkpoint.skip_damaged`` takes; a checkpoint folder that is a file is refused before training.
"""
from __future__ import annotations

import glob
import os
import re

import pytest
import torch
import torch.distributed as dist
from torch import nn

from npudist.plan.schema import CheckpointConfig
from npudist.train.checkpoint import MANIFEST, Checkpointer, CheckpointError, list_saves


class _Data:
    """The part of TextDataset the checkpointer uses."""
    seq_len = 4

    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position, "seq_len": self.seq_len}

    def load_state_dict(self, state):
        self.position = int(state["position"])


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _ckpt(folder, fill: float, total_steps=10, **cfg) -> Checkpointer:
    """A checkpointer over a 2x2 linear layer whose weights are all ``fill``."""
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.fill_(fill)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    cfg = CheckpointConfig(enable_checkpoint=True, folder=str(folder), interval=1, **cfg)
    return Checkpointer(cfg, [model], opt, sched, _Data(), global_batch_size=2, total_steps=total_steps)


def _weight(ck: Checkpointer) -> float:
    return float(ck.model[0].weight.detach()[0, 0])


def _saved_steps(folder) -> list[int]:
    return sorted(s.step for s in list_saves(str(folder)))


def _run(folder, fill, steps, **cfg) -> Checkpointer:
    ck = _ckpt(folder, fill, **cfg)
    ck.load()
    for step in steps:
        ck.maybe_save(step)
    return ck


@pytest.mark.timeout(60)
def test_retention_keeps_this_runs_save_over_another_runs_higher_step(group, tmp_path):
    folder = tmp_path / "ck"
    _run(folder, 1.0, [1, 2], load_step=0)          # run A: step-1 and step-2
    with pytest.raises(CheckpointError, match=r"holds saves of another run \(step-1, step-2\).*overwrite true"):
        _run(folder, 2.0, [1], load_step=0, keep_latest_k=1)
    assert _saved_steps(folder) == [1, 2]           # the refusal touched nothing
    _run(folder, 2.0, [1], load_step=0, keep_latest_k=1, overwrite=True)   # run B saves step 1 only
    assert _saved_steps(folder) == [1]              # A's step-2 was the older write; B's step-1 stays
    resumed = _ckpt(folder, 0.0)
    assert resumed.load() == 1 and _weight(resumed) == 2.0


@pytest.mark.timeout(60)
def test_resume_of_an_earlier_step_continues_from_the_latest_write(group, tmp_path):
    folder = tmp_path / "ck"
    _run(folder, 1.0, [1, 2, 3], load_step=0)
    ck = _ckpt(folder, 0.0, load_step=1, keep_latest_k=2)
    assert ck.load() == 1 and _weight(ck) == 1.0
    with torch.no_grad():
        ck.model[0].weight.fill_(5.0)
    ck.maybe_save(2)                                # replaces step-2; step-3 was written before it
    assert _saved_steps(folder) == [2, 3]
    assert [s.step for s in list_saves(str(folder))][-1] == 2
    latest = _ckpt(folder, 0.0)
    assert latest.load() == 2 and _weight(latest) == 5.0


def _damage_and_resume(folder, damage, **cfg):
    _run(folder, 1.0, [1], load_step=0)
    ck = _run(folder, 1.0, [], load_step=1)
    with torch.no_grad():
        ck.model[0].weight.fill_(3.0)
    ck.maybe_save(2)
    damage(os.path.join(str(folder), "step-2"))
    resumed = _ckpt(folder, 0.0, **cfg)
    return resumed, resumed.load()


def _truncate_shard(path):
    shard = sorted(glob.glob(os.path.join(path, "*.distcp")))[0]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    return shard


def _truncate_metadata(path):
    with open(os.path.join(path, ".metadata"), "r+b") as f:
        f.truncate(10)


def _scramble_shard(path):
    shard = sorted(glob.glob(os.path.join(path, "*.distcp")))[0]
    size = os.path.getsize(shard)
    with open(shard, "wb") as f:
        f.write(b"\x07" * size)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage,names", [(_truncate_shard, r"step-2/__0_0\.distcp has \d+ bytes, the save wrote"),
                                          (_truncate_metadata, r"step-2/\.metadata has 10 bytes"),
                                          (_scramble_shard, r"step-2 cannot be loaded")])
def test_a_damaged_save_names_itself_and_offers_the_intact_one(group, tmp_path, damage, names):
    with pytest.raises(CheckpointError) as err:
        _damage_and_resume(tmp_path / "ck", damage)
    msg = str(err.value)
    assert "checkpoint step 2 is damaged" in msg and re.search(names, msg), msg
    assert "checkpoint.load_step 1" in msg and "checkpoint.skip_damaged true" in msg, msg

    resumed, step = _damage_and_resume(tmp_path / "ck2", damage, skip_damaged=True)
    assert step == 1 and _weight(resumed) == 1.0
    assert resumed.notes and "skipped damaged checkpoint step 2" in resumed.notes[0]


@pytest.mark.timeout(60)
def test_a_save_without_a_manifest_is_still_resumed(group, tmp_path):
    folder = tmp_path / "ck"
    _run(folder, 4.0, [1], load_step=0)
    os.remove(folder / "step-1" / MANIFEST)          # as written by an npudist without manifests
    ck = _ckpt(folder, 0.0)
    assert ck.load() == 1 and _weight(ck) == 4.0


@pytest.mark.timeout(60)
def test_a_folder_that_is_a_file_is_refused_before_training(group, tmp_path):
    path = tmp_path / "ck"
    path.write_text("not a folder")
    with pytest.raises(CheckpointError, match="is a file, not a directory"):
        _ckpt(path, 1.0).load()
