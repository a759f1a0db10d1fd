"""Saving and resuming training: model, optimizer, LR schedule, data position and step.

Written with ``torch.distributed.checkpoint`` (DCP), as torchtitan does: every rank writes its own shards
(FSDP/TP DTensors, pipeline stages) into ``<folder>/step-<N>``, and DCP reshards them on load, so a run may
resume under another layout (FSDP, TP, PP, other degrees) than the one that saved it.

Layout independence needs every key to mean the same thing under every layout:
* model and optimizer keys are the full model's parameter names (``layers.3.attention.wq.weight``), without
  the index of the pipeline stage module that holds them on this rank;
* the data position is one global sample offset (``data.position``), saved once for the whole job, together
  with the batch shape it counts in. A resume whose global batch size, sequence length, data seed or data
  file size differs is refused, naming old and new values (the same offset would then name other samples);
  the micro-batch size, gradient accumulation and dp degree may change freely.

A save is atomic: all ranks write into ``<folder>/.tmp-step-<N>``, DCP writes ``.metadata`` last, and only
then rank 0 renames the folder to ``step-<N>``. A crash or kill at any point of a save leaves the previous
``step-*`` folders as they were, so the resume takes the newest complete one.
"""
from __future__ import annotations

import os
import re
import shutil

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-step-"
# Optimizer state keyed "state.<param fqn>.<key>" / "param_groups.<param fqn>.<key>" (as torchtitan): the
# nested form lost the hyperparameters of a pipeline stage's param groups on load (torch 2.13).
_OPTIM = StateDictOptions(flatten_optimizer_state_dict=True)
# Keys of this rank's parts ("<part index>.<fqn>"): the part index depends on the pipeline layout.
_PART_PREFIX = re.compile(r"^(state\.|param_groups\.)?\d+\.")
# What a position in global samples is counted in: a resume must keep these (see module docstring).
BATCH_SHAPE = ("global_batch_size", "seq_len")


def step_dir(folder: str, step: int) -> str:
    return os.path.join(folder, f"step-{step}")


def list_saved_steps(folder: str) -> list[int]:
    """Steps with a complete save in ``folder``, ascending."""
    if not os.path.isdir(folder):
        return []
    steps = []
    for name in os.listdir(folder):
        m = _STEP_DIR.match(name)
        if m and os.path.exists(os.path.join(folder, name, ".metadata")):
            steps.append(int(m.group(1)))
    return sorted(steps)


def _strip_part_index(state: dict) -> tuple[dict, dict[str, str]]:
    """(state keyed by layout-independent names, {new key: this rank's key})."""
    out, names = {}, {}
    for key, value in state.items():
        new = _PART_PREFIX.sub(lambda m: m.group(1) or "", key, count=1)
        assert new not in out, f"two model parts hold {new!r}"
        out[new], names[new] = value, key
    return out, names


def _restore_part_index(state: dict, names: dict[str, str]) -> dict:
    return {names[k]: v for k, v in state.items()}


def check_batch_shape(saved: dict, current: dict, where: str) -> None:
    """ValueError naming old and new values if the batch shape a data position counts in changed."""
    changed = [f"data.{k} {saved[k]} -> {current[k]}" for k in BATCH_SHAPE
               if k in saved and int(saved[k]) != int(current[k])]
    if changed:
        raise ValueError(
            f"cannot resume from {where}: the batch shape changed ({', '.join(changed)}; saved -> this run). "
            "The saved data position counts samples of the saved shape, so continuing would silently train on "
            "other data. Resume with the saved values, or start fresh (checkpoint.load_step 0 or another "
            "checkpoint.folder). micro_batch_size and the parallel layout may change.")


class Checkpointer:
    """Saves every ``cfg.interval`` steps and after the last one; ``load`` resumes from ``cfg.load_step``."""

    def __init__(self, cfg, parts: list[nn.Module], optimizer, lr_scheduler, dataset, global_batch_size: int,
                 total_steps: int):
        self.cfg = cfg
        self.model = nn.ModuleList(parts)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.dataset = dataset
        self.batch_shape = {"global_batch_size": global_batch_size, "seq_len": dataset.seq_len}
        self.total_steps = total_steps

    def _data_state(self) -> dict:
        return {**self.dataset.state_dict(), **self.batch_shape}

    def _state(self, step: int) -> tuple[dict, dict[str, str], dict[str, str]]:
        model, model_names = _strip_part_index(get_model_state_dict(self.model))
        optim, optim_names = _strip_part_index(
            get_optimizer_state_dict(self.model, self.optimizer, options=_OPTIM))
        state = {"model": model, "optimizer": optim, "lr_scheduler": self.lr_scheduler.state_dict(),
                 "data": self._data_state(), "train_state": {"step": step}}
        return state, model_names, optim_names

    def _choose_step(self) -> int:
        cfg = self.cfg
        saved = list_saved_steps(cfg.folder)
        if cfg.load_step == -1:
            return saved[-1] if saved else 0
        if cfg.load_step not in saved:
            raise ValueError(f"checkpoint.load_step={cfg.load_step}: no complete checkpoint "
                             f"{step_dir(cfg.folder, cfg.load_step)} (saved steps: {saved or 'none'}); use -1 for "
                             "the newest or 0 to start fresh")
        return cfg.load_step

    def load(self) -> int:
        """Restores the checkpoint the config names and returns its step (0 = nothing loaded)."""
        cfg = self.cfg
        if not cfg.enable_checkpoint or cfg.load_step == 0:
            return 0
        step = self._choose_step()
        if step == 0:
            return 0
        path = step_dir(cfg.folder, step)
        if step > self.total_steps:
            raise ValueError(f"checkpoint {path} is past training.steps={self.total_steps}; "
                             "raise training.steps to continue training")
        keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        if "data.position" not in keys:
            raise ValueError(f"checkpoint {path} has no global data position (data.position): it was written "
                             "by an older npudist that saved one position per data-parallel rank; resume it with "
                             "that version, or start fresh (checkpoint.load_step 0)")
        # The small part first: a changed batch shape is refused before any model state is read.
        head = {"data": self._data_state(), "train_state": {"step": 0}}
        dcp.load(head, checkpoint_id=path)
        check_batch_shape(head["data"], self.batch_shape, path)
        self.dataset.load_state_dict(head["data"])
        state, model_names, optim_names = self._state(step)
        del state["data"], state["train_state"]
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, _restore_part_index(state["model"], model_names))
        set_optimizer_state_dict(self.model, self.optimizer, _restore_part_index(state["optimizer"], optim_names),
                                 options=_OPTIM)
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        return int(head["train_state"]["step"])

    def due(self, step: int) -> bool:
        """True if ``maybe_save(step)`` will save."""
        cfg = self.cfg
        return cfg.enable_checkpoint and not (step % cfg.interval and step != self.total_steps)

    def maybe_save(self, step: int) -> bool:
        cfg = self.cfg
        if not self.due(step):
            return False
        final = step_dir(cfg.folder, step)
        tmp = os.path.join(cfg.folder, f"{_TMP_PREFIX}{step}")
        leader = dist.get_rank() == 0
        if leader:
            shutil.rmtree(tmp, ignore_errors=True)   # left by a save that was killed
            os.makedirs(cfg.folder, exist_ok=True)
        dist.barrier()
        dcp.save(self._state(step)[0], checkpoint_id=tmp)
        dist.barrier()   # every rank's shards and the metadata are on disk
        if leader:
            _replace_dir(tmp, final)
            if cfg.keep_latest_k > 0:
                for old in list_saved_steps(cfg.folder)[:-cfg.keep_latest_k]:
                    shutil.rmtree(step_dir(cfg.folder, old), ignore_errors=True)
        dist.barrier()   # nobody goes on (or exits and resumes) before step-<N> exists
        return True


def _replace_dir(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``. An existing ``dst`` (the same step saved again after a resume) is moved to
    ``.old-step-<N>`` first and deleted after; a crash between the two renames leaves both copies complete
    under hidden names, which a resume does not take (it falls back to the previous step)."""
    if os.path.exists(dst):
        old = os.path.join(os.path.dirname(dst), ".old-" + os.path.basename(dst))
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dst, old)
        os.rename(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(src, dst)
