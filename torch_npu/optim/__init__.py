"""``torch_npu.optim``: Ascend's fused optimizers whose update is a torch optimizer's (docs/torch_npu.md).

On Ascend the fused optimizers combine every parameter of a group into one flat buffer so that one kernel
updates them all; the update itself is the named algorithm's. Here each is that torch optimizer (with
``foreach`` updates, one multi-tensor kernel per step) under torch_npu's name, signature and defaults; the four
whose algorithm PyTorch lacks (AdamP, BERT's Adam, LAMB, TensorFlow's RMSprop) are in ``algorithms``.
``NpuFusedOptimizerBase`` (``npu_fused_optim_base``) is torch_npu's parameter-combining base class, for optimizers
written against it.
"""
from __future__ import annotations

import torch
from torch.optim.optimizer import required

from .npu_fused_optim_base import NpuFusedOptimizerBase
from .algorithms import NpuFusedAdamP, NpuFusedBertAdam, NpuFusedLamb, NpuFusedRMSpropTF

__all__ = ["NpuFusedOptimizerBase", "NpuFusedSGD", "NpuFusedAdadelta", "NpuFusedAdam", "NpuFusedAdamW",
           "NpuFusedRMSprop", "NpuFusedAdamP", "NpuFusedBertAdam", "NpuFusedLamb", "NpuFusedRMSpropTF"]


class NpuFusedSGD(torch.optim.SGD):
    """SGD with momentum (torch.optim.SGD's update)."""

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False):
        if lr is required:
            raise ValueError("NpuFusedSGD: lr is required")
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, foreach=True)


class NpuFusedAdadelta(torch.optim.Adadelta):
    """Adadelta (torch.optim.Adadelta's update)."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0):
        super().__init__(params, lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, foreach=True)


class NpuFusedAdam(torch.optim.Adam):
    """Adam with L2 weight decay (torch.optim.Adam's update)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=True)


class NpuFusedAdamW(torch.optim.AdamW):
    """AdamW, decoupled weight decay (torch.optim.AdamW's update)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=True)


class NpuFusedRMSprop(torch.optim.RMSprop):
    """RMSprop (torch.optim.RMSprop's update)."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False):
        super().__init__(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                         centered=centered, foreach=True)
