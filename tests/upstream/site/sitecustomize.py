"""Start-up of every interpreter run_pytorch_tests.py launches (its PYTHONPATH puts this folder first): the pytest
process and each rank process PyTorch's harness spawns get the npu adaptation before any test file is imported."""
import npu_harness

npu_harness.adapt()
