"""Registers the npu device with PyTorch: PrivateUse1 renamed ``npu``, ``torch.npu``, generated methods."""
import sys

import torch

from npudist import _C  # noqa: F401  (loading it registers allocator, guard, hooks and kernels)

BACKEND = "npu"


def register(module_name: str) -> None:
    """Make ``module_name`` (npudist.device) ``torch.npu``; idempotent."""
    _C._validate_config()  # ValueError naming the malformed environment variable
    if torch._C._get_privateuse1_backend_name() != BACKEND:
        torch.utils.rename_privateuse1_backend(BACKEND)
    current = getattr(torch, BACKEND, None)
    if current is not sys.modules[module_name]:
        from npudist import unavailable
        if unavailable.is_stand_in(current):   # autoload met a variable fixed since
            unavailable.replace(module_name)
        else:
            torch._register_device_module(BACKEND, sys.modules[module_name])
    if not hasattr(torch.Tensor, BACKEND):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True, for_packed_sequence=True)
