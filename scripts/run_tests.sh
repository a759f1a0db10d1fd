#!/usr/bin/env bash
# Quick-start command 2: set everything up, then run the whole test suite (2 xdist workers) with asynchronous
# launch (the default, docs/device.md "Asynchronous launch"), then a subset covering the device, the allocator,
# hccl and training parity again with ASCEND_LAUNCH_BLOCKING=1: results must be right in both launch modes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/python -m pytest -n 2 --dist loadgroup --durations=30 "$@" tests  # the slowest tests, for the 30-minute budget
BLOCKING_SUBSET=(
  tests/device/test_async_launch.py
  tests/device/test_repeated_calls.py
  tests/device/test_npu_streams.py
  tests/device/test_npu_random.py
  tests/device/test_npu_fallback.py
  tests/device/test_npu_training.py
  tests/device/test_runtime_c_api.py
  tests/allocator
  # ACL calls on torch's npu streams stay ordered with torch kernels that run inline (docs/cann.md)
  tests/ecosystem/test_acl_extension.py
  # hccl on npu tensors (the cpu-tensor scenarios do not depend on the launch mode)
  tests/hccl/test_collectives.py::test_async_wait_out_of_order
  tests/hccl/test_collectives.py::test_npu_wait_orders_the_current_stream
  tests/hccl/test_collectives.py::test_gloo_extras_cpu_npu
  tests/hccl/test_npu_ddp.py::test_zero_copy_collectives_npu
  tests/hccl/test_npu_ddp.py::test_p2p_coalesced_objects_functional_async_npu
  # training parity: one run per kind of parallelism (every layout runs in the asynchronous pass above)
  "tests/training/test_parity.py::test_parity[fsdp2]"
  "tests/training/test_parity.py::test_parity[tp2]"
  "tests/training/test_parity.py::test_parity[pp2_1f1b]"
  "tests/training/test_parity.py::test_parity[fsdp2_tp2]"
  tests/graphs
  tests/sanitizer/test_sanitizer.py
)
ASCEND_LAUNCH_BLOCKING=1 exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@" "${BLOCKING_SUBSET[@]}"
