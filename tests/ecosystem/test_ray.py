"""Ray sees npudist's emulated NPUs by itself (its NPU detection imports pyACL from the emulated CANN home) and
Ray Train's TorchTrainer trains DDP over hccl with one NPU per worker."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cann_env import clear_cann_environment
from npudist.cann import smi

SCRIPT = Path(__file__).parent / "scripts" / "ray_train.py"
TIMEOUT = 400  # s; about a minute on an idle 2-core machine (Ray's daemons, two workers importing torch)


_OURS = re.compile(r"npudist|torch_npu|hccl|ascend|\bacl\b|\bnpu\b", re.I)


def _npu_tracebacks(output: str) -> list[str]:
    """Tracebacks that involve npu/acl code: a frame in such a file, or an exception line naming it. Ray prints
    its own under load (GCS and autoscaler timeouts) and its next log lines, which name the NPU resource, fall in
    the same block; those are not ours."""
    blocks = re.split(r"(?=Traceback \(most recent call last\))", output)[1:]
    ours = []
    for block in blocks:
        lines = block[:3000].splitlines()
        telling = [ln for ln in lines if 'File "' in ln or re.search(r"(Error|Exception)\b", ln)]
        if any(_OURS.search(ln) for ln in telling):
            ours.append(block[:2000])
    return ours


def _session_pids(sid: int) -> set[int]:
    """The processes of session ``sid`` (Ray's daemons and workers run in the driver's)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()   # after "(comm)": state ppid pgrp session ...
        except (OSError, IndexError):
            continue   # exited meanwhile
        if int(fields[3]) == sid:
            pids.add(int(entry))
    return pids


def _remove_usage_records_of_killed_workers(pids: set[int]) -> None:
    """Ray ends its workers with SIGKILL, so their device usage records (/dev/shm/npudist-usage-<pid>) outlive
    them; npu-smi's reader removes the records of processes that are gone (its first call: those Ray killed
    before exiting), and of ``pids`` (the session's processes the test kills) once the kill has landed. Only
    those are waited for: another test's live process keeps its record as long as it runs."""
    names = {f"{smi.PREFIX}{pid}" for pid in pids}
    deadline = time.monotonic() + 5
    while True:
        smi.read_processes()
        if not names & set(os.listdir("/dev/shm")) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


@pytest.mark.timeout(TIMEOUT + 30)
def test_ray_detects_npus_and_trains_with_hccl(tmp_path, monkeypatch):
    pytest.importorskip("ray.train.torch", reason="ray[train] is not installed (requirements-test.txt pins it)")
    clear_cann_environment(monkeypatch)
    # Ray's session directory holds its sockets, whose paths must stay under 108 bytes: a short directory.
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    env = dict(os.environ, NPUDIST_DEVICE_COUNT="4")
    proc = subprocess.Popen([sys.executable, str(SCRIPT)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver's session: Ray's daemons and workers too
        out, _ = proc.communicate()
        pytest.fail(f"the Ray job took more than {TIMEOUT} s:\n{out[-6000:]}")
    finally:
        left = _session_pids(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything Ray left behind in the session
        except ProcessLookupError:
            pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
        _remove_usage_records_of_killed_workers(left)
    assert proc.returncode == 0, out[-8000:]
    report = json.loads(out.split("REPORT ", 1)[1].splitlines()[0])
    assert report["npus"] == 4, report                       # ray.init() counted the devices through acl.rt
    assert report["accelerator_types"] == ["accelerator_type:NpudistEmulatedNPU"], report  # acl.get_soc_name()
    assert report["error"] is None, report
    # Ray may echo a worker's line more than once (its log monitor): one per rank.
    workers = {w["rank"]: w for w in (json.loads(m) for m in re.findall(r"WORKER (\{.*\})", out))}
    assert sorted(workers) == [0, 1], out[-6000:]
    workers = list(workers.values())
    for w in workers:
        assert w["device"] == "npu:0" and w["backend"] == "hccl", w   # each worker sees its one NPU as npu:0
        assert w["max_err"] < 1e-6, w
    assert sorted(w["visible"] for w in workers) in (["0", "1"], ["0", "2"], ["1", "2"], ["0", "3"], ["1", "3"],
                                                      ["2", "3"]), workers  # Ray assigned distinct NPUs
    assert not _npu_tracebacks(out), _npu_tracebacks(out)[0]
    assert "Failed to detect NPU" not in out, out[-6000:]
