"""The language-model loss: mean token cross-entropy, also under a vocab-sharded (loss-parallel) output."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.distributed.tensor.parallel import loss_parallel


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over all tokens of the (micro)batch, computed in fp32. Every window has the same length and no
    padding, so the mean of equal-sized micro-batch means is the global mean: the reduction is exact under
    data parallelism, gradient accumulation and pipeline micro-batching alike."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def loss_context(enabled: bool):
    """``loss_parallel()`` when the logits are a vocab-sharded DTensor; must wrap forward *and* backward."""
    return loss_parallel() if enabled else contextlib.nullcontext()
