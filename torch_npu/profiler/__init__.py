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
    supported_activities,
)

from ._config import (
    AiCMetrics,
    ExportType,
    HostSystem,
    ProfilerLevel,
    _ExperimentalConfig,
    supported_ai_core_metrics,
    supported_export_type,
    supported_profiler_level,
)

__all__ = [
    "profile", "ProfilerActivity", "ProfilerAction", "schedule", "tensorboard_trace_handler",
    "supported_activities", "record_function", "_ExperimentalConfig", "ProfilerLevel", "AiCMetrics",
    "ExportType", "HostSystem", "supported_profiler_level", "supported_ai_core_metrics", "supported_export_type",
]


class profile(_tp.profile):  # noqa: N801 - Ascend's (and torch's) class name
    """``torch.profiler.profile`` that also takes Ascend's ``experimental_config=_ExperimentalConfig(...)``.

    Every other argument is torch.profiler.profile's. An Ascend config is checked and kept as
    ``self.npu_experimental_config``; a torch ``_ExperimentalConfig`` is passed through to torch.
    """

    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
                 profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
                 experimental_config=None, execution_trace_observer=None, custom_trace_id_callback=None,
                 use_cuda=None):
        kwargs = dict(activities=activities, schedule=schedule, on_trace_ready=on_trace_ready,
                      record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
                      with_flops=with_flops, with_modules=with_modules,
                      execution_trace_observer=execution_trace_observer,
                      custom_trace_id_callback=custom_trace_id_callback)
        if use_cuda is not None:
            kwargs["use_cuda"] = use_cuda
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
        super().__init__(experimental_config=experimental_config, **kwargs)


def schedule(wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0,
             skip_first_wait: int = 0):
    """torch.profiler.schedule with torch_npu's positional order (``schedule(wait, active, warmup, ...)``)."""
    return _tp.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first,
                        skip_first_wait=skip_first_wait)


def tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag: bool = True, async_mode: bool = False):
    """Write each finished step's trace into ``dir_name`` (default: the working directory) as torch's
    handler does. ``analyse_flag``/``async_mode`` select Ascend's offline msprof analysis of the collected
    data; the trace here is already final, so there is nothing to analyse and they change nothing."""
    return _tp.tensorboard_trace_handler(dir_name if dir_name is not None else ".", worker_name)
