"""``torch_npu.profiler``: Ascend's profiler API names over ``torch.profiler``.

Scripts written for Ascend (``torch_npu.profiler.profile(activities=[ProfilerActivity.CPU,
ProfilerActivity.NPU], schedule=..., on_trace_ready=tensorboard_trace_handler(dir))``) run unchanged; what
they get is torch.profiler's result with npudist's npu device activity (kernels, copies and hccl
collectives per npu stream, npu memory events): ``key_averages()``, ``export_chrome_trace()`` and a
Chrome/Perfetto trace file per step written by ``tensorboard_trace_handler``. Ascend's msprof output
(the ``*_ascend_pt`` directory and its analysis) does not exist here, nor do hardware counters: see
docs/debugging.md ("Profiling") for what each ``_ExperimentalConfig`` field does.
"""
from __future__ import annotations

import torch.profiler as _tp
from torch.profiler import (  # noqa: F401  re-exported under Ascend's names
    ProfilerAction,
    ProfilerActivity,
    record_function,
    schedule,
    supported_activities,
    tensorboard_trace_handler,
)

from ._config import AiCMetrics, ExportType, ProfilerLevel, _ExperimentalConfig

__all__ = [
    "profile", "ProfilerActivity", "ProfilerAction", "schedule", "tensorboard_trace_handler",
    "supported_activities", "record_function", "_ExperimentalConfig", "ProfilerLevel", "AiCMetrics",
    "ExportType",
]


class profile(_tp.profile):  # noqa: N801 - Ascend's (and torch's) class name
    """``torch.profiler.profile`` that also takes Ascend's ``experimental_config=_ExperimentalConfig(...)``.

    Every other argument is torch.profiler.profile's. An Ascend config is checked and kept as
    ``self.npu_experimental_config``; a torch ``_ExperimentalConfig`` is passed through to torch.
    """

    def __init__(self, *args, experimental_config=None, **kwargs):
        if isinstance(experimental_config, _ExperimentalConfig):
            experimental_config.check()
            self.npu_experimental_config = experimental_config
            experimental_config = None
        elif experimental_config is not None and not isinstance(experimental_config, _tp._ExperimentalConfig):
            raise ValueError(
                "torch_npu.profiler.profile: experimental_config must be torch_npu.profiler._ExperimentalConfig "
                f"(or torch.profiler._ExperimentalConfig), got {type(experimental_config).__name__}")
        else:
            self.npu_experimental_config = None
        super().__init__(*args, experimental_config=experimental_config, **kwargs)
