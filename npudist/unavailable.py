"""``torch.npu`` and the ``hccl`` backend when a malformed environment variable stops the npu device from
registering at ``import torch`` (autoload).

PyTorch's autoload cannot report an error without making ``import torch`` fail for every program, so npudist
warns there instead; this module makes the *use* of the device fail with that same error. ``torch.device("npu")``
parses, and then every npu use -- a tensor created on or moved to npu (torch's lazy device initialisation calls
``torch.npu._lazy_init``), any ``torch.npu.*`` function, ``init_process_group("hccl")`` -- raises the
ValueError naming the variable, where it would otherwise fail with an unrelated "Expected one of cpu, cuda, ...
device type" error. ``torch.npu.is_available()`` is False and ``device_count()`` 0, as torch.cuda reports
under a bad ``CUDA_VISIBLE_DEVICES``.
"""
from __future__ import annotations

import sys
import types

import torch

BACKEND = "npu"


class UnavailableDevice(types.ModuleType):
    """The stand-in ``torch.npu``: every attribute but the probes raises ``error``."""

    # Recognised by this marker, not by class: a re-import of npudist (after autoload forgot the half-registered
    # package) makes a new class object.
    npudist_stand_in = True

    def __init__(self, error: BaseException) -> None:
        super().__init__("torch.npu", f"npu device unavailable: {error}")
        self.error = error

    def is_available(self) -> bool:
        return False

    def device_count(self) -> int:
        return 0

    def _lazy_init(self) -> None:
        raise self.error

    def __getattr__(self, name: str):
        if name.startswith("__"):   # introspection (hasattr(m, "__path__"), copy, inspect) must not raise
            raise AttributeError(name)
        raise self.error


def _create_backend(dist_opts, pg_options):
    """The hccl creator until the device registers: the device's error, or the real backend once it is there
    (``npudist.register()`` after the variable was fixed in this process)."""
    npu = getattr(torch, BACKEND, None)
    if is_stand_in(npu):
        raise npu.error
    from npudist.hccl import _create_backend as create
    return create(dist_opts, pg_options)


def is_stand_in(module) -> bool:
    return getattr(type(module), "npudist_stand_in", False)


def install(error: BaseException) -> None:
    """Register the stand-ins: ``npu`` as a device name, ``torch.npu`` and the ``hccl`` backend."""
    import torch.distributed as dist

    if torch._C._get_privateuse1_backend_name() != BACKEND:
        torch.utils.rename_privateuse1_backend(BACKEND)
    if getattr(torch, BACKEND, None) is None:
        torch._register_device_module(BACKEND, UnavailableDevice(error))
    if not hasattr(torch.Tensor, BACKEND):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True, for_packed_sequence=True)
    if "hccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("hccl", _create_backend, extended_api=True, devices=["npu", "cpu"])
    dist.Backend.default_device_backend_map[BACKEND] = "hccl"


def replace(module_name: str) -> None:
    """Make the real device module ``torch.npu`` in place of the stand-in. torch has no API to replace a
    registered device module, so this does what ``torch._register_device_module`` does, once more."""
    module = sys.modules[module_name]
    setattr(torch, BACKEND, module)
    sys.modules[f"torch.{BACKEND}"] = module
