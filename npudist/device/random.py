"""torch.npu random-number state: per-device npu generators, independent of the CPU generator.

State is CUDA's 16-byte (seed, offset) layout (see device_core/hooks.cpp), which DTensor's random ops and
pipelining's fork_rng read and write.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from npudist import _C
from npudist.device import core


class _DefaultGenerators:
    """Lazy, indexable view of the per-device default generators (``torch.npu.default_generators``)."""

    def __getitem__(self, idx: int) -> torch.Generator:
        return _C._default_generator(core._checked_index(idx, optional=False))

    def __len__(self) -> int:
        return core.device_count()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


default_generators = _DefaultGenerators()


def _gen(device: Any) -> torch.Generator:
    return _C._default_generator(core._checked_index(device))


def get_rng_state(device: Any = "npu") -> torch.Tensor:
    """The (seed, offset) state of ``device``'s generator as a 16-byte uint8 CPU tensor."""
    return _gen(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "npu") -> None:
    """Restore a state returned by :func:`get_rng_state`."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.numel() != 16:
        raise ValueError("set_rng_state expects the 16-byte uint8 tensor returned by torch.npu.get_rng_state()")
    _gen(device).set_state(new_state.cpu().contiguous())


def get_rng_state_all() -> list[torch.Tensor]:
    """States of all devices' generators."""
    return [g.get_state() for g in default_generators]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restore the states of all devices' generators."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seed the current device's generator."""
    _gen(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator (``torch.manual_seed`` calls this)."""
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a non-deterministic number."""
    _gen(None).seed()


def seed_all() -> None:
    """Seed all devices' generators with one non-deterministic number."""
    s = _gen(None).seed()
    for g in default_generators:
        g.manual_seed(s)


def initial_seed() -> int:
    """The current device generator's seed."""
    return _gen(None).initial_seed()
