"""A script written for Huawei's torch_npu (``import torch_npu``, ``torch_npu.npu.*``, ``hccl``) runs unchanged."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import tempfile
    import torch
    import torch.distributed as dist
    import torch_npu
    import torch_npu.npu

    assert torch_npu.npu is torch.npu and sys.modules["torch_npu.npu"] is torch.npu
    torch_npu.npu.set_device(0)
    x = torch.randn(8).npu()
    assert x.device == torch.device("npu:0") and torch_npu.npu.current_device() == 0
    torch_npu.npu.synchronize()
    assert dist.is_hccl_available()
    store = dist.FileStore(tempfile.mktemp(), 1)
    dist.init_process_group("hccl", store=store, rank=0, world_size=1)
    y = x.clone()
    dist.all_reduce(y)
    assert torch.equal(y.cpu(), x.cpu())
    dist.destroy_process_group()
    print("TORCH_NPU SCRIPT OK")
""")


def test_torch_npu_script_runs_unchanged(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", "import sys\n" + SCRIPT], capture_output=True, text=True,
                         timeout=120, env=env, cwd=str(tmp_path))
    assert res.returncode == 0 and "TORCH_NPU SCRIPT OK" in res.stdout, res.stdout + res.stderr[-3000:]


def test_ascend_ops_not_provided_are_absent_not_faked(tmp_path):
    # The provided fused operators are tested in tests/ecosystem/test_fused_ops.py.
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", "import torch_npu; torch_npu.npu_lstm"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert res.returncode != 0 and "AttributeError" in res.stderr and "npu_lstm" in res.stderr
