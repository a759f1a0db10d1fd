"""DeepSpeed on npu + hccl with nothing set by hand: ZeRO-2 with the optimizer offloaded to cpu. DeepSpeed's NPU op
builder compiles its cpu_adam op against $ASCEND_HOME_PATH (include/, lib64/libascendcl.so) and torch_npu/lib
(libtorch_npu.so), which npudist's emulated CANN home provides. The op build happens once per machine (torch's
extension cache); measured in docs/cann.md."""
import json
import sys
from pathlib import Path

import pytest

from cann_env import clear_cann_environment

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
from launch_helpers import run_npurun, worker_lines  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "deepspeed_offload.py"
TIMEOUT = 900  # s: a first run compiles DeepSpeed's cpu_adam (about 2 min on an idle 2-core machine)


@pytest.mark.timeout(TIMEOUT + 30)
def test_zero2_cpu_offload_trains_on_npu_like_adamw_on_cpu(tmp_path, monkeypatch):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (requirements-test.txt pins it)")
    clear_cann_environment(monkeypatch)
    res = run_npurun(["--nproc", "2", str(SCRIPT)], tmp_path, timeout=TIMEOUT)
    assert res.returncode == 0, res.output[-8000:]
    reports = {r: json.loads(v) for r, v in worker_lines(res, "REPORT").items()}
    assert sorted(reports) == [0, 1], res.output[-8000:]
    for rank, rep in reports.items():
        assert rep["accelerator"] == "npu" and rep["backend"] == "hccl", rep
        assert rep["device"] == rep["param_device"] == f"npu:{rank}", rep
        assert rep["optimizer"] == "DeepSpeedCPUAdam", rep   # the offloaded optimizer: the C++ op built and loaded
        assert rep["ascend_home"] and rep["ascend_home"].endswith("cann/home"), rep
        assert rep["max_err"] < 1e-5, rep
