"""Expert parallelism: a mixture-of-experts model's experts split over the ep ranks, tokens sent to them by
all-to-all (``apply_ep``)."""
from .core import AllToAllDispatch, apply_ep, shard_expert_weights, sync_expert_grads

__all__ = ["AllToAllDispatch", "apply_ep", "shard_expert_weights", "sync_expert_grads"]
