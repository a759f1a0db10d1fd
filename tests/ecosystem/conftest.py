import os
import subprocess
import sys

import npudist  # noqa: F401  (registers the npu device and the npu operators)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (library detection such as transformers' happens once per process)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)
