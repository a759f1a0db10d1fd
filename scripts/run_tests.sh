#!/usr/bin/env bash
# Quick-start command 2: set everything up, then run the whole test suite (2 xdist workers) with asynchronous
# launch (the default, docs/device.md "Asynchronous launch"), then a subset covering the device, the allocator,
# hccl and training parity again with ASCEND_LAUNCH_BLOCKING=1: results must be right in both launch modes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -n 2 --dist loadgroup "$@" tests
BLOCKING_SUBSET=(
  tests/device/test_async_launch.py
  tests/device/test_npu_streams.py
  tests/device/test_npu_random.py
  tests/device/test_npu_fallback.py
  tests/device/test_npu_training.py
  tests/device/test_runtime_c_api.py
  tests/allocator
  tests/hccl/test_collectives.py
  tests/training/test_parity.py
  tests/graphs
  tests/sanitizer/test_sanitizer.py
)
ASCEND_LAUNCH_BLOCKING=1 exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@" "${BLOCKING_SUBSET[@]}"
