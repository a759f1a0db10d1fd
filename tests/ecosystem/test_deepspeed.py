"""DeepSpeed on npu + hccl with nothing set by hand: ZeRO-2 with the optimizer offloaded to cpu. DeepSpeed's NPU op
builder compiles its cpu_adam op against $ASCEND_HOME_PATH (include/, lib64/libascendcl.so) and torch_npu/lib
(libtorch_npu.so), which npudist's emulated CANN home provides. The op is built into an extension cache inside the
environment (EXTENSIONS_DIR), which `scripts/setup.sh --test` fills once, so the test loads it; measured in
docs/cann.md."""
import json
import os
import sys
from pathlib import Path

import pytest

from cann_env import clear_cann_environment

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
from launch_helpers import run_npurun, worker_lines  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "deepspeed_offload.py"
TIMEOUT = 900  # s: without the setup's prebuild, a run compiles DeepSpeed's cpu_adam (about 2 min on 2 idle cores)
# torch's JIT extension cache, one per environment: scripts/setup.sh --test builds cpu_adam into it. The shared
# default (~/.cache/torch_extensions) is rebuilt whenever another checkout built it last (ninja sees the other
# paths in the compile command).
EXTENSIONS_DIR = os.path.join(sys.prefix, "torch_extensions")


@pytest.mark.timeout(TIMEOUT + 30)
def test_zero2_cpu_offload_trains_on_npu_like_adamw_on_cpu(tmp_path, monkeypatch):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (requirements-test.txt pins it)")
    clear_cann_environment(monkeypatch)
    if not os.environ.get("TORCH_EXTENSIONS_DIR"):   # a cache the caller chose wins
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", EXTENSIONS_DIR)
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
