"""npurun given options that cannot work, a malformed environment, failing workers: exit code and message, no
traceback, no hang. Each case is one npurun subprocess with a timeout; the worker scripts import no torch."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def npurun(args: list[str], tmp_path, **extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ASCEND_RT_VISIBLE_DEVICES", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")}
    env.update(TMPDIR=str(tmp_path), **extra)
    return subprocess.run([sys.executable, "-m", "npudist.launch", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=90)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text("print('ran')\n")
    return str(path)


@pytest.mark.parametrize("args,message", [
    (["--nnodes", "1", "--node-rank", "3", "--rdzv-backend", "static"],
     "--node-rank 3 is not a node of this job: --nnodes 1 has node ranks 0..0"),
    (["--nnodes", "2", "--master-port", "70000"], "--master-port 70000: port 70000 is out of range"),
    (["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:70000"], "port 70000 is out of range"),
    (["--ranks-filter", "5"], "--ranks-filter names rank(s) 5 but this job has ranks 0..1"),
], ids=["node-rank", "master-port", "rdzv-port", "ranks-filter"])
def test_options_that_cannot_work_are_refused(tmp_path, script, args, message):
    r = npurun(["--device", "cpu", "--nproc", "2", *args, script], tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr and "ran" not in r.stdout


def test_log_dir_that_is_a_file_and_a_malformed_variable(tmp_path, script):
    r = npurun(["--device", "cpu", "--nproc", "1", "--log-dir", script, script], tmp_path)
    assert r.returncode == 2 and f"--log-dir {script} is a file" in r.stderr and "Traceback" not in r.stderr
    r = npurun(["--nproc", "1", script], tmp_path, NPUDIST_DEVICE_COUNT="abc")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "RuntimeWarning" not in r.stderr
    assert r.stderr.startswith("npurun: NPUDIST_DEVICE_COUNT='abc' is not a device count"), r.stderr


RANKS = """
import os, sys, time
rank = int(os.environ["RANK"])
if rank == 0:
    time.sleep(1)   # the other rank exits first; the summary must still quote a real error
    sys.exit("error: invalid thing: 3 errors\\n  a: one\\n  b: two\\n  c: three\\n  d: four")
if rank == 1:
    sys.exit("error: invalid thing: 3 errors (the whole report: rank 0)")
"""


def test_the_summary_quotes_each_failed_rank_from_the_head_of_its_error(tmp_path):
    (tmp_path / "ranks.py").write_text(RANKS)
    r = npurun(["--device", "cpu", "--nproc", "2", "ranks.py"], tmp_path)
    assert r.returncode == 1
    summary = [ln for ln in r.stderr.splitlines() if ln.startswith("npurun:   rank")]
    assert "npurun:   rank 1: error: invalid thing: 3 errors (the whole report: rank 0)" in summary, r.stderr
    assert "npurun:   rank 0: error: invalid thing: 3 errors" in summary or any(
        "stopped after the failure" in ln for ln in r.stderr.splitlines())


def test_a_silent_exit_code_is_named_as_such(tmp_path):
    (tmp_path / "exit3.py").write_text("import sys\nsys.exit(3)\n")
    r = npurun(["--device", "cpu", "--nproc", "1", "--tee", "3", "exit3.py"], tmp_path)
    assert r.returncode == 1
    assert "npurun:   rank 0: (exited with code 3 without writing to stderr; its stdout is in the logs)" in r.stderr
    assert "not redirected" not in r.stderr
