"""PyTorch's own distributed test files, run on npu + hccl unchanged.

The one documented place where their harness learns the device. PyTorch's DTensor and c10d harnesses are
device-generic through ``torch.accelerator`` (npu, hccl as its default backend) and need nothing. Two spots of
the pinned torch's harness name their devices instead:

* ``common_fsdp`` picks ``DEVICE_TYPE`` / ``DISTRIBUTED_BACKEND`` / ``DEVICE_COUNT`` from a list (cuda, hpu,
  xpu, else cpu + gloo): set to npu, hccl and the visible npu count; and its code for a non-CUDA accelerator sits
  behind ``TEST_XPU`` (each rank selects its device, delays sleep on the host): set for npu in that module;
* ``common_distributed.skip_if_lt_x_gpu`` counts only cuda/hpu/xpu devices (so every multi-device FSDP2 test
  would skip): replaced by the same decorator counting ``torch.accelerator`` devices.

Both must be set before a test file is imported (the files bind these names at import), in the pytest process
and in every rank process the harness spawns (a spawned rank imports the test file again): ``site/sitecustomize.py``
calls ``adapt()`` at the start of each interpreter that run_pytorch_tests.py launches.
"""
from __future__ import annotations

import functools
import sys

import torch
from torch.testing._internal import common_distributed, common_fsdp

import npudist  # noqa: F401  (registers npu and hccl; torch's autoload normally did already)


def skip_if_lt_x_gpu(x, *, allow_cpu=False):
    """PyTorch's decorator, counting accelerator devices of any type."""

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if torch.accelerator.device_count() >= x:
                return func(*args, **kwargs)
            skip = common_distributed.TEST_SKIPS[f"multi-gpu-{x}"]
            if not common_distributed._maybe_handle_skip_if_lt_x_gpu(args, skip.message):
                sys.exit(skip.exit_code)
        return wrapper

    return decorator


def adapt():
    common_fsdp.DEVICE_TYPE = "npu"
    common_fsdp.DISTRIBUTED_BACKEND = "hccl"
    common_fsdp.DEVICE_COUNT = torch.accelerator.device_count()
    common_fsdp.TEST_XPU = True
    common_distributed.skip_if_lt_x_gpu = skip_if_lt_x_gpu
