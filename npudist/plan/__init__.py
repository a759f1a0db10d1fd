"""YAML training plans: schema (dataclasses), loading with CLI overrides, validation.

    plan = load_plan("examples/plans/fsdp_tp.yaml", overrides=["--parallel.tp_degree", "2"], world_size=4)
"""
from .errors import PlanError
from .loader import load_plan, parse_overrides, parse_yaml
from .patterns import matches as pattern_matches, select_names
from .schema import (ACConfig, CheckpointConfig, CPConfig, CompileConfig, DataConfig, FSDPConfig, LoggingConfig, ModelConfig,
                     OptimizerConfig, ParallelConfig, ParallelDegrees, Plan, PPConfig, ScheduleConfig, TPConfig,
                     TrainingConfig)
from .validate import validate_plan

__all__ = [
    "load_plan", "parse_overrides", "parse_yaml", "validate_plan", "PlanError", "pattern_matches",
    "select_names", "Plan", "ModelConfig", "DataConfig", "OptimizerConfig", "ScheduleConfig", "TrainingConfig",
    "LoggingConfig", "ParallelConfig", "ParallelDegrees", "FSDPConfig", "TPConfig", "PPConfig", "ACConfig",
    "CheckpointConfig", "CompileConfig", "CPConfig",
]
