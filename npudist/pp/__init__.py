"""Pipeline parallelism over ``torch.distributed.pipelining``."""
from npudist.pp.core import SCHEDULES, build_pipeline, split_stage

__all__ = ["SCHEDULES", "build_pipeline", "split_stage"]
