"""Autocast support for npu (``torch.autocast("npu", dtype=torch.bfloat16)``, also float16).

The op lists are registered in C++ (device_core/aten/autocast.cpp) for the AutocastPrivateUse1 key, with the
same lower-precision / fp32 / promote policies CUDA uses.
"""
from __future__ import annotations

import functools

import torch


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes torch.autocast accepts on npu."""
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = False) -> bool:
    """bfloat16 is supported (it runs through the CPU kernels)."""
    return True


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.npu.amp.autocast(...)`` == ``torch.autocast("npu", ...)`` (torch_npu compatibility)."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


@functools.wraps(torch.amp.GradScaler)
def GradScaler(*args, **kwargs):  # noqa: N802  (mirrors torch.cuda.amp.GradScaler)
    """A torch.amp.GradScaler for npu."""
    return torch.amp.GradScaler("npu", *args, **kwargs)
