"""Deterministic seeding: the same seed gives the same initial model on every rank and every run."""
from __future__ import annotations

import random

import numpy as np
import torch


def set_seed(seed: int, deterministic: bool = True) -> None:
    """Seed Python, NumPy and torch (all devices). Every rank uses the same seed so that the full model is
    initialised identically everywhere before it is split and sharded; data order is seeded separately by
    the dataset. ``deterministic`` also asks torch for deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
