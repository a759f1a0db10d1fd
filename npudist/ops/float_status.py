"""The float status operators of Ascend's saturation-mode parts (the 910), which keep an overflow register that
mixed-precision loss scaling polls: ``npu_alloc_float_status`` (a status buffer), ``npu_clear_float_status`` and
``npu_get_float_status``.

The emulated device has IEEE inf/nan arithmetic, as Ascend 910B and later, where overflow shows in the values and
no register records it (torch.npu.get_npu_overflow_flag raises for the same reason). So:

* ``npu_alloc_float_status(self)``: 8 float32 zeros on ``self``'s device (the documented result);
* ``npu_clear_float_status(self, mode=0)``: there is no register to clear; returns the cleared status, 8 zeros;
* ``npu_get_float_status(self, mode=0)``: raises RuntimeError naming itself -- a status of zeros would claim "no
  overflow" for every step; check the values (``torch.isfinite``, ``GradScaler``) instead.
"""
from __future__ import annotations

import torch

_STATUS_WORDS = 8


def _check_mode(op, mode):
    if mode != 0:
        raise ValueError(f"{op}: mode {mode} is not documented; use 0")


def npu_alloc_float_status(self):
    return torch.zeros(_STATUS_WORDS, dtype=torch.float32, device=self.device)


def npu_clear_float_status(self, mode=0):
    _check_mode("npu_clear_float_status", mode)
    return torch.zeros(_STATUS_WORDS, dtype=torch.float32, device=self.device)


def npu_get_float_status(self, mode=0):
    _check_mode("npu_get_float_status", mode)
    raise RuntimeError("npu_get_float_status: unsupported on a device with inf/nan arithmetic (as torch_npu on Ascend "
                       "910B and later): no status register records overflow; check the values (torch.isfinite, "
                       "GradScaler) instead")


_lib = torch.library.Library("npu", "FRAGMENT")
for _schema, _fn in (("npu_alloc_float_status(Tensor self) -> Tensor", npu_alloc_float_status),
                     ("npu_get_float_status(Tensor self, int mode=0) -> Tensor", npu_get_float_status),
                     ("npu_clear_float_status(Tensor self, int mode=0) -> Tensor", npu_clear_float_status)):
    _lib.define(_schema)
    _lib.impl(_schema.split("(", 1)[0], _fn, "CompositeImplicitAutograd")
