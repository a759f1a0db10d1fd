"""run_pytorch_tests.py on a small tree laid out as PyTorch's: its FSDP2 harness runs on npu + hccl (the npu
adaptation reaches the spawned ranks), outcomes are read per test, and the expected-failure list is checked in
both directions. (The real files are PyTorch's and run against a PyTorch checkout: docs/hccl.md.)"""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "run_pytorch_tests.py"
FSDP_DIR = "test/distributed/_composable/fsdp"

TINY = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
    from torch.testing._internal.common_fsdp import FSDPTest, get_devtype
    from torch.testing._internal.common_utils import run_tests

    device_type = torch.device(get_devtype())


    class TestTiny(FSDPTest):
        @property
        def world_size(self):
            return 2

        @skip_if_lt_x_gpu(2)
        def test_shards_on_npu_over_hccl(self):
            self.assertEqual(device_type.type, "npu")
            self.assertEqual(dist.get_backend(), "hccl")
            self.assertEqual(torch.npu.current_device(), self.rank)
            model = fully_shard(nn.Linear(8, 8, device=device_type))
            self.assertEqual(model.weight.to_local().device, torch.device("npu", self.rank))
            model(torch.ones(2, 8, device=device_type)).sum().backward()
            full = model.weight.grad.full_tensor()
            self.assertEqual(full, torch.full((8, 8), 2.0, device=full.device))

        @skip_if_lt_x_gpu(2)
        def test_fails(self):
            self.assertEqual(self.rank, 5)


    if __name__ == "__main__":
        run_tests()
''')


# The list check's two directions need one test that passes and one that fails, not FSDP2's harness (whose
# tests spawn a process per rank that imports torch again): a plain unittest file gives the runner the same
# junit outcomes at the cost of one pytest process.
PLAIN = textwrap.dedent('''
    import unittest


    class TestPlain(unittest.TestCase):
        def test_passes(self):
            self.assertEqual(1 + 1, 2)

        def test_fails(self):
            self.assertEqual(1, 5)
''')


def _run(tmp_path, expected_lines, files):
    expected = tmp_path / "expected.txt"
    expected.write_text("".join(line + "\n" for line in expected_lines))
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, str(RUNNER), "--pytorch-src", str(tmp_path / "src"), "--devices", "2",
           "--test-timeout", "240", "--expected", str(expected), "--out", str(out), "--check"]
    for f in files:
        cmd += ["--file", f]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    return proc, {r["test"]: r for r in map(json.loads, out.read_text().splitlines())}


@pytest.mark.timeout(1200)
def test_runner_on_a_pytorch_style_tree(tmp_path):
    fsdp = tmp_path / "src" / FSDP_DIR
    fsdp.mkdir(parents=True)
    (fsdp / "test_fully_shard_tiny.py").write_text(TINY)
    (fsdp / "test_fully_shard_broken.py").write_text("from torch.distributed.fsdp import no_such_name\n")
    tiny, broken = f"{FSDP_DIR}/test_fully_shard_tiny.py", f"{FSDP_DIR}/test_fully_shard_broken.py"
    ok, fails = f"{tiny}::TestTiny::test_shards_on_npu_over_hccl", f"{tiny}::TestTiny::test_fails"

    proc, results = _run(tmp_path, [f"{fails}  # the test asserts a wrong rank", f"{broken}  # imports a missing name"],
                         [tiny, broken])
    assert results[ok]["outcome"] == "passed", results[ok]["detail"]
    assert results[fails]["outcome"] == "failed" and "5" in results[fails]["detail"]
    assert results[broken]["outcome"] == "error" and "no_such_name" in results[broken]["detail"]
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # unlisted failure and a listed test that passes: both reported, the run fails
    (fsdp / "test_plain.py").write_text(PLAIN)
    plain = f"{FSDP_DIR}/test_plain.py"
    passes, fails = f"{plain}::TestPlain::test_passes", f"{plain}::TestPlain::test_fails"
    proc, results = _run(tmp_path, [f"{passes}  # claimed to fail", f"{broken}  # imports a missing name"],
                         [plain, broken])
    assert results[passes]["outcome"] == "passed" and results[fails]["outcome"] == "failed", results
    assert proc.returncode == 1
    assert f"not listed in expected_failures.txt: {fails}" in proc.stdout
    assert f"stale: {passes} is listed but did not fail" in proc.stdout


def test_expected_list_needs_a_reason_per_line(tmp_path):
    sys.path.insert(0, str(HERE))
    try:
        import run_pytorch_tests as runner
    finally:
        sys.path.remove(str(HERE))
    bad = tmp_path / "expected.txt"
    bad.write_text("test/x.py::A::test_b\n")
    with pytest.raises(ValueError, match="has no reason"):
        runner.read_expected(str(bad))
    assert runner.read_expected(str(runner.EXPECTED)) == {}   # the checked-in list: every listed run passed
