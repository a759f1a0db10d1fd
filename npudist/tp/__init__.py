"""Tensor parallelism over PyTorch's ``parallelize_module``."""
from npudist.tp.core import apply_tp, resolve_tp_plan

__all__ = ["apply_tp", "resolve_tp_plan"]
