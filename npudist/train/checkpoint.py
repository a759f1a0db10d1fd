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

Nothing a run wrote is lost to another: each save carries a manifest (``npudist-save.json``: its write
sequence number and every file's size), "newest" means most recently written, not highest step, and
``keep_latest_k`` keeps the k most recently written saves, so the save a run has just written is never the one
deleted. A fresh start into a folder that holds saves is refused unless ``checkpoint.overwrite`` says the run
may replace them. A damaged save (a file missing or shorter than the manifest says, an unreadable
``.metadata``, a shard DCP cannot read) is reported with its file and step, and the newest intact save is
offered (``checkpoint.skip_damaged`` takes it).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-step-"
MANIFEST = "npudist-save.json"
# Optimizer state keyed "state.<param fqn>.<key>" / "param_groups.<param fqn>.<key>" (as torchtitan): the
# nested form lost the hyperparameters of a pipeline stage's param groups on load (torch 2.13).
_OPTIM = StateDictOptions(flatten_optimizer_state_dict=True)
# Keys of this rank's parts ("<part index>.<fqn>"): the part index depends on the pipeline layout.
_PART_PREFIX = re.compile(r"^(state\.|param_groups\.)?\d+\.")
# What a position in global samples is counted in: a resume must keep these (see module docstring).
BATCH_SHAPE = ("global_batch_size", "seq_len")


def step_dir(folder: str, step: int) -> str:
    return os.path.join(folder, f"step-{step}")


class CheckpointError(ValueError):
    """A checkpoint the run cannot use or write as configured; the message names the save and the fix."""


@dataclass(frozen=True)
class Save:
    """A complete save in a folder. ``seq`` orders saves by when they were written (-1: a save without a
    manifest, written by an older npudist: older than every save with one)."""
    step: int
    path: str
    seq: int
    files: Optional[dict]   # file name -> size in bytes, as written; None without a manifest


def _read_manifest(path: str) -> Optional[dict]:
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def list_saves(folder: str) -> list[Save]:
    """Complete saves in ``folder`` (their ``.metadata`` exists), oldest written first."""
    if not os.path.isdir(folder):
        return []
    saves = []
    for name in os.listdir(folder):
        m = _STEP_DIR.match(name)
        path = os.path.join(folder, name)
        if m and os.path.exists(os.path.join(path, ".metadata")):
            man = _read_manifest(path) or {}
            files = man.get("files") if isinstance(man.get("files"), dict) else None
            seq = man.get("seq") if isinstance(man.get("seq"), int) else -1
            saves.append(Save(int(m.group(1)), path, seq, files))
    return sorted(saves, key=lambda s: (s.seq, s.step))


def list_saved_steps(folder: str) -> list[int]:
    """Steps with a complete save in ``folder``, ascending."""
    return sorted(s.step for s in list_saves(folder))


def find_damage(save: Save) -> Optional[str]:
    """None if ``save`` is intact as far as can be told without reading it whole, else what is wrong, naming the
    file: a file of its manifest missing or of another size, or a ``.metadata`` DCP cannot read."""
    for name, size in sorted((save.files or {}).items()):
        path = os.path.join(save.path, name)
        try:
            got = os.path.getsize(path)
        except OSError:
            return f"{path} is missing (the save wrote {size} bytes)"
        if got != size:
            return f"{path} has {got} bytes, the save wrote {size} ({'truncated' if got < size else 'changed'})"
    try:
        dcp.FileSystemReader(save.path).read_metadata()
    except Exception as e:   # noqa: BLE001 -- any failure to unpickle means the save cannot be loaded
        return f"{os.path.join(save.path, '.metadata')} cannot be read ({type(e).__name__}: {e})"
    return None


def _write_manifest(path: str, step: int, seq: int) -> None:
    files = {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            files[os.path.relpath(full, path)] = os.path.getsize(full)
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"format": 1, "step": step, "seq": seq, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(path, MANIFEST))


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

    def _check_folder(self) -> None:
        """Refuse a folder the run could not save into before any step is trained."""
        folder = self.cfg.folder
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise CheckpointError(f"checkpoint.folder {folder!r} is a file, not a directory: choose another "
                                  "checkpoint.folder (or move the file away)")
        probe = folder
        while not os.path.exists(probe):   # the nearest existing ancestor decides whether it can be created
            probe = os.path.dirname(os.path.abspath(probe))
        if not os.access(probe, os.W_OK | os.X_OK):
            raise CheckpointError(f"checkpoint.folder {folder!r}: {probe!r} is not writable, so no save could be "
                                  "written; choose a writable checkpoint.folder or disable checkpointing "
                                  "(checkpoint.enable_checkpoint false)")

    def _refuse_foreign_saves(self, saves: list[Save]) -> None:
        if saves and not self.cfg.overwrite:
            names = ", ".join(os.path.basename(s.path) for s in saves)
            raise CheckpointError(
                f"checkpoint.folder {self.cfg.folder!r} holds saves of another run ({names}) and this run starts "
                "fresh (checkpoint.load_step 0): its saves would replace them. Resume them (checkpoint.load_step "
                "-1 or a step), choose another checkpoint.folder, or set checkpoint.overwrite true to let this run "
                "replace them")

    def _candidates(self, saves: list[Save]) -> list[Save]:
        """The save the config names, then the older intact-looking ones a damaged one may fall back to."""
        cfg = self.cfg
        if cfg.load_step == -1:
            return saves[::-1]
        named = [s for s in saves if s.step == cfg.load_step]
        if not named:
            raise CheckpointError(
                f"checkpoint.load_step={cfg.load_step}: no complete checkpoint {step_dir(cfg.folder, cfg.load_step)} "
                f"(saved steps: {sorted(s.step for s in saves) or 'none'}); use -1 for the newest or 0 to start "
                "fresh")
        return named + [s for s in saves[::-1] if s.seq < named[0].seq]

    def _damaged(self, save: Save, problem: str, rest: list[Save]) -> CheckpointError:
        intact = next((s for s in rest if find_damage(s) is None), None)
        offer = (f"the newest intact save is {intact.path}: resume it with checkpoint.load_step {intact.step}, or "
                 "set checkpoint.skip_damaged true to take it" if intact else
                 "no other intact save exists: start fresh (checkpoint.load_step 0 with checkpoint.overwrite true)")
        return CheckpointError(f"checkpoint step {save.step} is damaged: {problem}; {offer}")

    def load(self) -> int:
        """Restores the checkpoint the config names and returns its step (0 = nothing loaded). Saves skipped as
        damaged (``checkpoint.skip_damaged``) are described in ``self.notes``."""
        cfg = self.cfg
        self.notes: list[str] = []
        if not cfg.enable_checkpoint:
            return 0
        self._check_folder()
        saves = list_saves(cfg.folder)
        if cfg.load_step == 0:
            self._refuse_foreign_saves(saves)
            return 0
        candidates = self._candidates(saves)
        for i, save in enumerate(candidates):
            problem = find_damage(save)
            if problem is None:
                try:
                    return self._load(save)
                except CheckpointError:
                    raise
                except (Exception, CheckpointException) as e:   # noqa: BLE001 -- a shard DCP cannot read
                    problem = f"{save.path} cannot be loaded ({_describe(e)})"
            err = self._damaged(save, problem, candidates[i + 1:])
            if not cfg.skip_damaged:
                raise err
            self.notes.append(f"skipped damaged checkpoint step {save.step}: {problem}")
        if candidates and cfg.skip_damaged:
            raise CheckpointError(f"no intact checkpoint in {cfg.folder!r} ({'; '.join(self.notes)}): start fresh "
                                  "(checkpoint.load_step 0 with checkpoint.overwrite true)")
        return 0

    def _load(self, save: Save) -> int:
        path = save.path
        if save.step > self.total_steps:
            raise CheckpointError(f"checkpoint {path} is past training.steps={self.total_steps}; "
                                  "raise training.steps to continue training")
        keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        if "data.position" not in keys:
            raise CheckpointError(f"checkpoint {path} has no global data position (data.position): it was "
                                  "written by an older npudist that saved one position per data-parallel rank; "
                                  "resume it with that version, or start fresh (checkpoint.load_step 0)")
        # The small part first: a changed batch shape is refused before any model state is read.
        head = {"data": self._data_state(), "train_state": {"step": 0}}
        dcp.load(head, checkpoint_id=path)
        check_batch_shape(head["data"], self.batch_shape, path)
        self.dataset.load_state_dict(head["data"])
        state, model_names, optim_names = self._state(save.step)
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

        def prepare():
            shutil.rmtree(tmp, ignore_errors=True)   # left by a save that was killed
            os.makedirs(cfg.folder, exist_ok=True)

        _on_leader(leader, prepare, f"cannot create checkpoint step {step} in {cfg.folder!r}")
        try:
            dcp.save(self._state(step)[0], checkpoint_id=tmp)
        except (Exception, CheckpointException) as e:   # noqa: BLE001 -- DCP raises it on every rank
            raise CheckpointError(f"cannot write checkpoint step {step} into {tmp!r}: {_describe(e)}; check the "
                                  "folder's space and permissions") from e
        dist.barrier()   # every rank's shards and the metadata are on disk

        def publish():
            seq = max((s.seq for s in list_saves(cfg.folder)), default=-1) + 1
            _write_manifest(tmp, step, seq)
            _replace_dir(tmp, final)
            if cfg.keep_latest_k > 0:   # the most recently written k: the save above is always among them
                for old in list_saves(cfg.folder)[:-cfg.keep_latest_k]:
                    shutil.rmtree(old.path, ignore_errors=True)

        # Nobody goes on (or exits and resumes) before step-<N> exists, and a failure there reaches every rank.
        _on_leader(leader, publish, f"cannot publish checkpoint step {step} as {final!r}")
        return True


def _describe(e: BaseException) -> str:
    """``Type: first line`` of an error; for DCP's CheckpointException, of the first failing rank's error."""
    if isinstance(e, CheckpointException) and e.failures:
        rank, (inner, _) = sorted(e.failures.items())[0]
        return f"rank {rank}: {_describe(inner)}"
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else repr(e)}"


def _on_leader(leader: bool, fn, what: str) -> None:
    """Run ``fn`` on rank 0 only; every rank then raises CheckpointError if it failed (instead of the others
    waiting in the next collective for a rank that has died)."""
    err = [None]
    if leader:
        try:
            fn()
        except OSError as e:
            err[0] = f"{what}: {e}"
    dist.broadcast_object_list(err, src=0)
    if err[0] is not None:
        raise CheckpointError(err[0])


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
