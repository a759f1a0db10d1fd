"""Build an example C++ extension (examples/<name>/run.py's ``build``) once, niced, in a child process with its own
session (killed whole on timeout: ninja and the compiler too); this process then loads the cached build."""
import os
import signal
import subprocess
import sys

import pytest

# Not `from conftest import REPO`: with several test directories collected, "conftest" may be another one's.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_example(example_dir: str, build_dir: str, timeout: float) -> str:
    """The loaded library's path; fails the test with the compiler output if the build fails or times out."""
    code = f"import sys; sys.path.insert(0, {example_dir!r}); import run; run.build({build_dir!r})"
    env = dict(os.environ, MAX_JOBS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"building {example_dir} took more than {timeout} s")
    assert proc.returncode == 0, out[-3000:] + err[-5000:]
    sys.path.insert(0, example_dir)
    try:
        import run
    finally:
        sys.path.remove(example_dir)
        sys.modules.pop("run", None)  # each example has its own run.py
    return run.build(build_dir)
