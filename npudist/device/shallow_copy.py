"""``module.to("npu")`` keeps its Parameter objects, as ``module.cuda()`` does.

``nn.Module._apply`` moves a parameter in place (``param.data = moved``) only when
``torch._has_compatible_shallow_copy_type(param, moved)`` is true; otherwise it builds new Parameter objects,
and an optimizer created before the move (accelerate's ``prepare(model, optimizer)``, any CUDA-style script)
silently keeps updating the old cpu tensors. c10 answers true only for its built-in dense backends and lets a
PrivateUse1 backend register this operator (PyTorch's OpenReg example does); npu tensors are dense strided
tensors like cpu ones, so cpu <-> npu metadata swaps are compatible.
"""
import torch

_lib = torch.library.Library("aten", "IMPL")


def _has_compatible_shallow_copy_type(self: torch.Tensor, from_: torch.Tensor) -> bool:
    return (self.layout == torch.strided and from_.layout == torch.strided
            and {self.device.type, from_.device.type} <= {"cpu", "npu"})


def register() -> None:
    _lib.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, "PrivateUse1")
