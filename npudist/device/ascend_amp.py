"""torch_npu's autocast and determinism switches on the npu device.

``is_autocast_enabled`` / ``set_autocast_enabled`` / ``get_autocast_dtype`` / ``set_autocast_dtype`` are
torch's per-device autocast state for ``"npu"`` (what ``torch.autocast("npu")`` sets). ``set_deterministic_level``
and ``enable/disable_deterministic_with_backward`` drive ``torch.use_deterministic_algorithms``, as torch_npu does.
"""
from __future__ import annotations

import warnings

import torch

__all__ = ["is_autocast_enabled", "set_autocast_enabled", "get_autocast_dtype", "set_autocast_dtype",
           "set_deterministic_level", "enable_deterministic_with_backward", "disable_deterministic_with_backward"]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("npu")


def set_autocast_enabled(enable: bool) -> None:
    torch.set_autocast_enabled("npu", enable)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("npu")


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype("npu", dtype)


_deterministic_level = 0


def set_deterministic_level(level: int) -> None:
    """Level 0: nondeterministic algorithms allowed; >= 1: ``torch.use_deterministic_algorithms(True)``.

    As torch_npu, a level that contradicts the current ``torch.use_deterministic_algorithms`` setting changes
    it with a warning. Every npu kernel here is a CPU kernel, so determinism is the CPU's under either level.
    """
    global _deterministic_level
    if isinstance(level, bool) or not isinstance(level, int) or level < 0:
        raise ValueError(f"torch.npu.set_deterministic_level: level must be an int >= 0, got {level!r}")
    enabled = torch.are_deterministic_algorithms_enabled()
    if (level >= 1) != enabled:
        warnings.warn("The current configuration value of 'torch_npu.npu.set_deterministic_level' conflicts with "
                      "'torch.use_deterministic_algorithms'. 'torch.use_deterministic_algorithms' has been "
                      f"configured to '{level >= 1}'.")
        torch.use_deterministic_algorithms(level >= 1)
    _deterministic_level = level


class _DeterministicBegin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        torch.use_deterministic_algorithms(True)
        return tensor

    @staticmethod
    def backward(ctx, grad):
        torch.use_deterministic_algorithms(False)
        return grad


class _DeterministicEnd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        torch.use_deterministic_algorithms(False)
        return tensor

    @staticmethod
    def backward(ctx, grad):
        torch.use_deterministic_algorithms(True)
        return grad


def enable_deterministic_with_backward(tensor: torch.Tensor) -> torch.Tensor:
    """Turn deterministic algorithms on from here in the forward pass, and off again at this point of the
    backward pass (it runs in reverse); returns ``tensor`` (as an autograd node)."""
    return _DeterministicBegin.apply(tensor)


def disable_deterministic_with_backward(tensor: torch.Tensor) -> torch.Tensor:
    """The closing mark of :func:`enable_deterministic_with_backward`: off in forward, back on in backward."""
    return _DeterministicEnd.apply(tensor)


# torch.compile must not trace these (they toggle global state), as torch_npu marks them.
enable_deterministic_with_backward._dynamo_forbidden = True
disable_deterministic_with_backward._dynamo_forbidden = True
