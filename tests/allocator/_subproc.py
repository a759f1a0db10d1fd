"""Run a snippet in a fresh interpreter (allocator env vars are read once per process)."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_snippet(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("PYTORCH_NPU_ALLOC_CONF", "PYTORCH_NO_NPU_MEMORY_CACHING", "OOM_SNAPSHOT"))}
    full_env.update(env or {})
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def check_snippet(code: str, env: dict | None = None, timeout: float = 120) -> str:
    res = run_snippet(code, env, timeout)
    assert res.returncode == 0, f"rc={res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"
    return res.stdout


def build_allocator_library(tmp_path_factory, name: str, source: str) -> str:
    """Compile a C pluggable allocator (`source`) into lib<name>.so in a fresh temporary folder; skips the
    test when gcc is missing."""
    import shutil
    import pytest
    if shutil.which("gcc") is None:
        pytest.skip("gcc not available")
    d = tmp_path_factory.mktemp(name)
    (d / f"{name}.c").write_text(source)
    so = str(d / f"lib{name}.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", str(d / f"{name}.c"), "-o", so], check=True, timeout=60)
    return so
