import os
import sys

import npudist  # noqa: F401  (registers the npu device and its profiler activity source before any profiling)

# tests/hccl/launcher.py starts the multi-rank scenarios.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hccl"))
