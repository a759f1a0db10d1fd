#!/usr/bin/env bash
# Quick-start command 2: set everything up, then run the whole test suite (2 xdist workers), then a named
# subset again with synchronous launch (ASCEND_LAUNCH_BLOCKING=1, docs/device.md "Asynchronous launch"):
# device, allocator, hccl and training parity must pass in both launch modes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -n 2 --dist loadgroup "$@" tests
BLOCKING_SUBSET=(
  tests/device/test_npu_streams.py
  tests/device/test_npu_fallback.py
  tests/device/test_npu_training.py
  tests/allocator/test_memory_api.py
  tests/hccl/test_npu_ddp.py
  tests/training/test_parity.py
)
ASCEND_LAUNCH_BLOCKING=1 exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@" "${BLOCKING_SUBSET[@]}"
