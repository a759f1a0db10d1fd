"""Saving and resuming training: model, optimizer, LR schedule, data position and step.

Written with ``torch.distributed.checkpoint`` (DCP), as torchtitan does: every rank writes its own shards
(FSDP/TP DTensors, pipeline stages) into ``<folder>/step-<N>``, and a resume may load them back under the
same layout. Model and optimizer state go through ``get_/set_model_state_dict`` and
``get_/set_optimizer_state_dict`` over all of this rank's model parts (one ``nn.ModuleList``, so pipeline
ranks with several stages save one consistent set of names). The data position differs per data-parallel
rank and is saved under ``data.dp<rank>``. A save is complete once ``.metadata`` exists (DCP writes it
last), so a crash mid-save leaves a folder that ``find_latest`` ignores.
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
# Optimizer state keyed "state.<param fqn>.<key>" / "param_groups.<param fqn>.<key>" (as torchtitan): the
# nested form lost the hyperparameters of a pipeline stage's param groups on load (torch 2.13).
_OPTIM = StateDictOptions(flatten_optimizer_state_dict=True)


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


class Checkpointer:
    """Saves every ``cfg.interval`` steps and after the last one; ``load`` resumes from ``cfg.load_step``."""

    def __init__(self, cfg, parts: list[nn.Module], optimizer, lr_scheduler, dataset, dp_rank: int,
                 total_steps: int):
        self.cfg = cfg
        self.model = nn.ModuleList(parts)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.dataset = dataset
        self.data_key = f"dp{dp_rank}"
        self.total_steps = total_steps

    def _state(self, step: int) -> dict:
        return {
            "model": get_model_state_dict(self.model),
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=_OPTIM),
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "data": {self.data_key: self.dataset.state_dict()},
            "train_state": {"step": step},
        }

    def load(self) -> int:
        """Restores the checkpoint the config names and returns its step (0 = nothing loaded)."""
        cfg = self.cfg
        if not cfg.enable_checkpoint or cfg.load_step == 0:
            return 0
        saved = list_saved_steps(cfg.folder)
        if cfg.load_step == -1:
            if not saved:
                return 0
            step = saved[-1]
        else:
            step = cfg.load_step
            if step not in saved:
                raise ValueError(f"checkpoint.load_step={step}: no complete checkpoint {step_dir(cfg.folder, step)} "
                                 f"(saved steps: {saved or 'none'}); use -1 for the newest or 0 to start fresh")
        if step > self.total_steps:
            raise ValueError(f"checkpoint {step_dir(cfg.folder, step)} is past training.steps={self.total_steps}; "
                             "raise training.steps to continue training")
        state = self._state(step)
        dcp.load(state, checkpoint_id=step_dir(cfg.folder, step))
        set_model_state_dict(self.model, state["model"])
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=_OPTIM)
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.dataset.load_state_dict(state["data"][self.data_key])
        return int(state["train_state"]["step"])

    def maybe_save(self, step: int) -> bool:
        cfg = self.cfg
        if not cfg.enable_checkpoint or (step % cfg.interval and step != self.total_steps):
            return False
        dcp.save(self._state(step), checkpoint_id=step_dir(cfg.folder, step))
        if cfg.keep_latest_k > 0:
            dist.barrier()   # every rank finished writing before old saves go
            if dist.get_rank() == 0:
                for old in list_saved_steps(cfg.folder)[:-cfg.keep_latest_k]:
                    shutil.rmtree(step_dir(cfg.folder, old), ignore_errors=True)
        return True
