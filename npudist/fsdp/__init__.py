"""FSDP2 and activation checkpointing over PyTorch's ``fully_shard`` / composable ``checkpoint``."""
from npudist.fsdp.core import apply_activation_checkpointing, apply_fsdp

__all__ = ["apply_fsdp", "apply_activation_checkpointing"]
