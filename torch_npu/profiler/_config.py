"""Ascend's ``torch_npu.profiler._ExperimentalConfig`` and its enums, checked honestly.

On Ascend these select msprof collection levels and AI Core hardware counters. The emulated npu has no
hardware counters and npudist's trace is torch.profiler's: the level changes nothing, and a request for
what does not exist here (``aic_metrics`` other than ``AiCoreNone``, ``l2_cache=True``, the db export)
warns that it will be absent rather than silently producing a trace without it.
"""
from __future__ import annotations

import warnings


class ProfilerLevel:
    Level_none = "Level_none"
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"


class AiCMetrics:
    AiCoreNone = "AiCoreNone"
    PipeUtilization = "PipeUtilization"
    ArithmeticUtilization = "ArithmeticUtilization"
    Memory = "Memory"
    MemoryL0 = "MemoryL0"
    ResourceConflictRatio = "ResourceConflictRatio"
    MemoryUB = "MemoryUB"
    L2Cache = "L2Cache"
    MemoryAccess = "MemoryAccess"


class ExportType:
    Text = "text"
    Db = "db"


class HostSystem:
    """Host system metrics Ascend's profiler can sample (``host_sys=[...]``); none is sampled here."""
    CPU = "cpu"
    MEM = "mem"
    DISK = "disk"
    NETWORK = "network"
    OSRT = "osrt"
    NUMA = "numa"


def supported_profiler_level() -> set[str]:
    """The levels ``_ExperimentalConfig`` accepts (each gives torch.profiler's trace here)."""
    return _values(ProfilerLevel)


def supported_ai_core_metrics() -> set[str]:
    """Only ``AiCoreNone``: the emulated npu has no AI Core counters (any other value records nothing)."""
    return {AiCMetrics.AiCoreNone}


def supported_export_type() -> set[str]:
    """Only ``Text``: the trace is written as Chrome JSON, there is no msprof db."""
    return {ExportType.Text}


_KNOWN = ("profiler_level", "aic_metrics", "l2_cache", "msprof_tx", "mstx", "data_simplification", "record_op_args",
          "op_attr", "gc_detect_threshold", "export_type", "host_sys", "mstx_domain_include", "mstx_domain_exclude",
          "sys_io", "sys_interconnection")


def _values(cls) -> set[str]:
    return {v for k, v in vars(cls).items() if not k.startswith("_")}


class _ExperimentalConfig:
    """Ascend's experimental profiler options (keyword names as upstream)."""

    def __init__(self, profiler_level: str = ProfilerLevel.Level0, aic_metrics: str = AiCMetrics.AiCoreNone,
                 l2_cache: bool = False, msprof_tx: bool = False, mstx: bool = False,
                 data_simplification: bool = True, record_op_args: bool = False, op_attr: bool = False,
                 gc_detect_threshold=None, export_type=ExportType.Text, host_sys=None, mstx_domain_include=None,
                 mstx_domain_exclude=None, sys_io: bool = False, sys_interconnection: bool = False, **unknown):
        if unknown:
            raise ValueError(f"torch_npu.profiler._ExperimentalConfig: unknown option(s) {sorted(unknown)}; "
                             f"known: {', '.join(_KNOWN)}")
        self.mstx = mstx     # torch.npu.mstx markers are profiler events whether or not this is set
        self.gc_detect_threshold = gc_detect_threshold
        self.host_sys = host_sys
        self.mstx_domain_include = mstx_domain_include
        self.mstx_domain_exclude = mstx_domain_exclude
        self.sys_io = sys_io
        self.sys_interconnection = sys_interconnection
        self.profiler_level = profiler_level
        self.aic_metrics = aic_metrics
        self.l2_cache = l2_cache
        self.op_attr = op_attr
        self.data_simplification = data_simplification
        self.record_op_args = record_op_args
        self.export_type = export_type
        self.msprof_tx = msprof_tx

    def check(self) -> None:
        if self.profiler_level not in _values(ProfilerLevel):
            raise ValueError(f"profiler_level={self.profiler_level!r} is not a torch_npu.profiler.ProfilerLevel "
                             f"({sorted(_values(ProfilerLevel))})")
        if self.aic_metrics not in _values(AiCMetrics):
            raise ValueError(f"aic_metrics={self.aic_metrics!r} is not a torch_npu.profiler.AiCMetrics "
                             f"({sorted(_values(AiCMetrics))})")
        types = self.export_type if isinstance(self.export_type, (list, tuple)) else [self.export_type]
        for t in types:
            if t not in _values(ExportType):
                raise ValueError(f"export_type={t!r} is not a torch_npu.profiler.ExportType "
                                 f"({sorted(_values(ExportType))})")
        absent = []
        if self.aic_metrics != AiCMetrics.AiCoreNone:
            absent.append(f"aic_metrics={self.aic_metrics}")
        if self.l2_cache:
            absent.append("l2_cache=True")
        if self.gc_detect_threshold is not None:
            absent.append("gc_detect_threshold (no GC events are recorded)")
        if self.host_sys:
            absent.append(f"host_sys={self.host_sys}")
        if self.mstx_domain_include or self.mstx_domain_exclude:
            absent.append("mstx_domain_include/exclude (markers of every domain are recorded)")
        if self.sys_io or self.sys_interconnection:
            absent.append("sys_io/sys_interconnection")
        if ExportType.Db in types:
            absent.append("export_type=db (the trace is written as Chrome JSON)")
        if absent:
            warnings.warn(f"torch_npu.profiler: {', '.join(absent)} asks for what the emulated npu does "
                          "not record (hardware counters, msprof db): the trace will not contain it (docs/debugging.md)",
                          stacklevel=3)
