#!/usr/bin/env bash
# Quick-start command 2: set everything up, then run the whole test suite (2 xdist workers; blocking launch,
# the default), then a named subset again with asynchronous launch (ASCEND_LAUNCH_BLOCKING=0, docs/device.md
# "Asynchronous launch"): the device tests must pass in both launch modes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -n 2 --dist loadgroup "$@" tests
ASYNC_SUBSET=(
  tests/device/test_async_launch.py
  tests/device/test_npu_streams.py
  tests/device/test_npu_random.py
  tests/device/test_npu_fallback.py
  tests/device/test_npu_training.py
  tests/device/test_runtime_c_api.py
  tests/graphs
  tests/sanitizer/test_sanitizer.py
)
ASCEND_LAUNCH_BLOCKING=0 exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@" "${ASYNC_SUBSET[@]}"
