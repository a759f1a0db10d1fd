"""``from torch_npu.contrib import transfer_to_npu``: a script written for CUDA runs on npu and hccl unchanged.

Like Ascend's migration module, importing this rewrites PyTorch's CUDA entry points to npu ones. This is the
one place in npudist that patches torch (it is what the module is for; every patch is listed in
``MAPPED`` and in docs/torch_npu.md). Mapped:

* devices: ``"cuda"``/``"cuda:N"``/``torch.device("cuda", N)`` arguments of tensor factories (``device=``),
  ``Tensor.to``, ``Module.to``, ``torch.autocast``/``torch.amp.GradScaler`` become npu; ``Tensor.cuda()`` and
  ``Module.cuda()`` are ``.npu()``;
* ``torch.cuda.*`` (is_available, device_count, set_device, current_device, synchronize, streams/events,
  memory stats, RNG, ``torch.cuda.amp.autocast``/``GradScaler``) call torch.npu;
* ``torch.distributed``: backend ``"nccl"`` (also inside ``"cuda:nccl"`` specs) becomes ``"hccl"`` in
  ``init_process_group`` and ``new_group``.
Nothing of this happens unless the module is imported (once per process, as any module).
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

import torch_npu  # noqa: F401  (registers the npu device and hccl)

_FACTORIES = (
    "tensor", "as_tensor", "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
    "full", "full_like", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "arange",
    "range", "linspace", "logspace", "eye", "tril_indices", "triu_indices", "scalar_tensor", "normal",
)
# torch.cuda names served by torch.npu (same name) when torch.npu has them.
_CUDA_NAMES = (
    "is_available", "device_count", "current_device", "set_device", "synchronize", "device", "device_of",
    "get_device_name", "get_device_properties", "get_device_capability", "is_initialized", "init", "Stream",
    "Event", "stream", "current_stream", "default_stream", "set_stream", "manual_seed", "manual_seed_all", "seed",
    "seed_all", "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
    "empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_stats", "memory_summary", "mem_get_info", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "memory_cached", "max_memory_cached", "is_bf16_supported", "_is_in_bad_fork", "_lazy_call",
)
MAPPED: list[str] = []


def _npu_device(dev: Any) -> Any:
    """cuda device spellings -> npu; anything else unchanged."""
    if isinstance(dev, str) and (dev == "cuda" or dev.startswith("cuda:")):
        return "npu" + dev[4:]
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("npu", dev.index) if dev.index is not None else torch.device("npu")
    return dev


def _npu_backend(backend: Any) -> Any:
    if isinstance(backend, str):
        return ",".join("npu:hccl" if part.strip() == "cuda:nccl" else "hccl" if part.strip() == "nccl"
                        else part for part in backend.split(","))
    return backend


def _map_device_kwarg(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _npu_device(kwargs["device"])
        return fn(*args, **kwargs)
    return wrapper


def _map_all_devices(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args = tuple(_npu_device(a) for a in args)
        kwargs = {k: _npu_device(v) if k in ("device", "device_type") else v for k, v in kwargs.items()}
        return fn(*args, **kwargs)
    return wrapper


def _map_backend(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if args:
            args = (_npu_backend(args[0]),) + args[1:]
        if "backend" in kwargs:
            kwargs["backend"] = _npu_backend(kwargs["backend"])
        return fn(*args, **kwargs)
    return wrapper


def _patch(owner: Any, name: str, new: Any, label: str) -> None:
    setattr(owner, name, new)
    MAPPED.append(label)


def _tensor_cuda(self, device=None, non_blocking=False, **kwargs):
    return self.npu(_npu_device(device), non_blocking=non_blocking)


def _module_cuda(self, device=None):
    return self.npu(_npu_device(device))


def _cuda_amp_autocast(enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
    return torch.npu.amp.autocast(enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


def _apply() -> None:
    for name in _FACTORIES:
        if hasattr(torch, name):
            _patch(torch, name, _map_device_kwarg(getattr(torch, name)), f"torch.{name}(device='cuda')")
    _patch(torch.Tensor, "to", _map_all_devices(torch.Tensor.to), "Tensor.to('cuda')")
    _patch(torch.nn.Module, "to", _map_all_devices(torch.nn.Module.to), "Module.to('cuda')")
    _patch(torch.Tensor, "cuda", _tensor_cuda, "Tensor.cuda()")
    _patch(torch.nn.Module, "cuda", _module_cuda, "Module.cuda()")
    for owner, label in ((torch, "torch.autocast"), (torch.amp, "torch.amp.autocast")):
        _patch(owner, "autocast", _map_all_devices(owner.autocast), f"{label}('cuda')")
    _patch(torch.amp, "GradScaler", _map_all_devices(torch.amp.GradScaler), "torch.amp.GradScaler('cuda')")
    for name in _CUDA_NAMES:
        if hasattr(torch.npu, name):
            fn = getattr(torch.npu, name)
            new = _map_all_devices(fn) if callable(fn) and not isinstance(fn, type) else fn
            _patch(torch.cuda, name, new, f"torch.cuda.{name}")
    _patch(torch.cuda.amp, "autocast", _cuda_amp_autocast, "torch.cuda.amp.autocast")
    _patch(torch.cuda.amp, "GradScaler", torch.npu.amp.GradScaler, "torch.cuda.amp.GradScaler")
    for name in ("init_process_group", "new_group"):
        _patch(dist, name, _map_backend(getattr(dist, name)), f"torch.distributed.{name}('nccl')")
    _patch(dist, "is_nccl_available", dist.is_hccl_available, "torch.distributed.is_nccl_available")


_apply()
