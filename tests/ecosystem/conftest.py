import os
import subprocess
import sys

import npudist  # noqa: F401  (registers the npu device and the npu operators)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code: str, env: dict | None = None, timeout: float = 180, cwd: str | None = None):
    """Run ``code`` in a fresh interpreter (imports like transformers' torch_npu detection happen once)."""
    full_env = dict(os.environ)
    for k in ("NPUDIST_DEVICE_COUNT", "ASCEND_RT_VISIBLE_DEVICES", "NPUDIST_DEVICE_MEMORY"):
        full_env.pop(k, None)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO)
