"""Context parallelism: every sequence split over the cp ranks, attention across them (``apply_cp``)."""
from .core import ContextParallelAttention, SequenceSharder, apply_cp

__all__ = ["ContextParallelAttention", "SequenceSharder", "apply_cp"]
