"""The standard install, end to end: a wheel built from this checkout with `pip wheel`, installed into a fresh
virtual environment with nothing but that wheel and its declared dependencies, is the whole product
(docs/install.md).

One module-scoped build and one fresh venv; each check is its own test. The build reuses the objects the
checkout's own install compiled (setup.py keeps them in build/temp), so it only links; what goes into the wheel is
decided by setup.py, MANIFEST.in and the build backend, not by what else lies in the checkout (build outputs in
place, a .venv: test_wheel_carries_only_the_product checks)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.xdist_group("wheel")]


def _run(cmd, timeout, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(cmd, timeout=timeout, **kw)


# Session scope: under pytest-xdist a module-scoped fixture is torn down and made again whenever the worker's
# next test belongs to another file, and this one builds a wheel and a venv (about a minute). The file lock makes
# the build happen once per run even when this file's tests land on several workers (pytest -n without
# --dist loadgroup): two builds in one checkout race on setuptools' build folders.
@pytest.fixture(scope="session")
def venv(tmp_path_factory, worker_id):
    from filelock import FileLock

    run_root = tmp_path_factory.getbasetemp()
    run_root = run_root if worker_id == "master" else run_root.parent   # shared by the run's workers
    base = run_root / "wheel"
    with FileLock(str(run_root / "wheel.lock")):
        if not (base / "ready").exists():
            _build_wheel_venv(base)
            (base / "ready").write_text("")
    return base / "venv", next((base / "dist").glob("npudist-*.whl"))


def _build_wheel_venv(base: Path) -> None:
    dist = base / "dist"
    base.mkdir(exist_ok=True)
    # A build that stopped half-way leaves setuptools' scratch .dist-info behind; the next build must not fail on it.
    (ROOT / "build" / f"bdist.{sysconfig.get_platform()}" / "wheel" / "npudist-0.1.0.dist-info").mkdir(
        parents=True, exist_ok=True)
    # --no-build-isolation: build against this environment's torch==2.13.0 (an isolated build would install
    # another copy of torch first); --no-deps: the wheel only, its dependencies are installed below.
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(dist), str(ROOT)],
             900, env=dict(os.environ, MAX_JOBS="1"), cwd=str(base))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = sorted(dist.glob("npudist-*.whl"))
    assert len(wheels) == 1, wheels
    env_dir = base / "venv"
    _run([sys.executable, "-m", "venv", str(env_dir)], 120, check=True)
    py = env_dir / "bin" / "python"
    # The wheel and its declared dependencies: torch==2.13.0 comes from the same index the checkout used.
    r = _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", str(wheels[0])], 900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def _clean_env() -> dict:
    """No trace of the checkout: no PYTHONPATH, no CANN variables from a test's environment."""
    drop = ("PYTHONPATH", "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "LD_LIBRARY_PATH", "NPUDIST_", "HCCL_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _py(venv, code, timeout=120, cwd=None):
    env_dir, _ = venv
    return _run([str(env_dir / "bin" / "python"), "-c", textwrap.dedent(code)], timeout, env=_clean_env(),
                cwd=cwd or str(env_dir))


def test_wheel_carries_everything(venv):
    import zipfile

    names = set(zipfile.ZipFile(venv[1]).namelist())
    for needed in ("npudist_cann_acl.pth", "npudist/cann/home/lib64/libascendcl.so", "torch_npu/lib/libtorch_npu.so",
                   "npudist/cann/home/python/site-packages/acl/__init__.py", "npudist/cann/home/include/acl/acl.h",
                   "npudist/include/npudist/extension.h", "npudist/cann/smi.py", "npudist/swap/oom.py"):
        assert needed in names, needed
    assert any(n.startswith("npudist/_C.") and n.endswith(".so") for n in names)
    assert any(n.startswith("npudist/hccl/_C.") and n.endswith(".so") for n in names)
    assert any(n.endswith(".data/purelib/torch_npu-2.13.0+npudist0.1.0.dist-info/METADATA") for n in names)


def test_wheel_carries_only_the_product(venv):
    import zipfile

    names = zipfile.ZipFile(venv[1]).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops <= {"npudist", "torch_npu", "npudist_cann_acl.pth", "npudist-0.1.0.dist-info", "npudist-0.1.0.data"}, tops
    # the extensions appear once each, built for this wheel (not a copy of an in-place build beside them)
    assert sum(n.startswith("npudist/_C.") for n in names) == 1
    assert not any(n.endswith((".o", ".pyc")) or "/tests/" in n for n in names)


def test_import_torch_brings_npu_without_warning(venv):
    r = _py(venv, """
        import warnings
        warnings.simplefilter("error")
        import torch
        x = torch.ones(4, device="npu") * 2
        print(torch.npu.is_available(), torch.npu.device_count(), x.sum().item())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "8", "8.0"]
    assert r.stderr == ""


def test_pyacl_and_torch_npu_metadata(venv):
    # `import acl` first, before torch: the .pth file alone puts the emulated pyACL on the path
    r = _py(venv, """
        import acl, importlib.metadata, sys, sysconfig
        site = sysconfig.get_paths()["purelib"]
        assert acl.__file__ == f"{site}/npudist/cann/home/python/site-packages/acl/__init__.py", acl.__file__
        import torch_npu
        print(importlib.metadata.version("torch_npu") == torch_npu.__version__, torch_npu.__version__)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "True"


def test_npurun_runs_a_two_rank_hccl_job(venv, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("hccl")
        rank = dist.get_rank()
        torch.npu.set_device(rank)
        t = torch.full((4,), float(rank + 1), device="npu")
        dist.all_reduce(t)
        print("RESULT", rank, t.tolist(), flush=True)
        dist.destroy_process_group()
    """))
    npurun = venv[0] / "bin" / "npurun"
    r = _run([str(npurun), "--nproc", "2", str(script)], 180, env=_clean_env(), cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    results = sorted(line for line in r.stdout.splitlines() if "RESULT" in line)
    assert len(results) == 2 and all(line.endswith("[3.0, 3.0, 3.0, 3.0]") for line in results), r.stdout


def test_npu_smi_lists_devices(venv):
    r = _run([str(venv[0] / "bin" / "npu-smi"), "info"], 60, env=_clean_env())
    assert r.returncode == 0, r.stderr
    devices = re.findall(r"^\| (\d+) +\S+ +\| OK ", r.stdout, re.M)   # one health row per device
    assert "npu-smi" in r.stdout and devices == [str(i) for i in range(8)], r.stdout


def test_cpp_extension_links_ascendcl_and_torch_npu(venv, tmp_path):
    """A user's C++ extension built as on Ascend: -lascendcl -ltorch_npu against the installed CANN home."""
    (tmp_path / "ext.cpp").write_text(textwrap.dedent("""
        #include <torch/extension.h>
        #include <acl/acl.h>
        int32_t device_count() { uint32_t n = 0; aclrtGetDeviceCount(&n); return static_cast<int32_t>(n); }
        PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("device_count", &device_count); }
    """))
    r = _py(venv, f"""
        import os, torch, npudist.cann.environment as cann
        from torch.utils.cpp_extension import load
        home, torch_npu_lib = cann.HOME, cann.TORCH_NPU_LIB
        ext = load("wheel_ext", [{str(tmp_path / 'ext.cpp')!r}], build_directory={str(tmp_path)!r},
                   extra_include_paths=[os.path.join(home, "include")],
                   extra_ldflags=[f"-L{{home}}/lib64", f"-L{{torch_npu_lib}}", "-lascendcl", "-ltorch_npu",
                                  f"-Wl,-rpath,{{home}}/lib64", f"-Wl,-rpath,{{torch_npu_lib}}"])
        print(ext.device_count())
    """, timeout=600, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.split()[-1] == "8"


def test_pip_check_is_clean(venv):
    r = _run([str(venv[0] / "bin" / "python"), "-m", "pip", "check"], 120, env=_clean_env())
    assert r.returncode == 0, r.stdout + r.stderr


def test_torch_npu_requirement_does_not_pull_another_torch(venv):
    """pip's resolver sees torch_npu as installed: a package that requires torch_npu (torchtitan-npu) resolves
    without Huawei's torch_npu and without another torch."""
    r = _run([str(venv[0] / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--report", "-", "--quiet",
              "torchtitan-npu==0.2.2.post2"], 300, env=_clean_env())
    if r.returncode != 0 and "No matching distribution found for torchtitan-npu" in r.stderr:
        pytest.skip("torchtitan-npu==0.2.2.post2 is not on this machine's package index")
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    chosen = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
              for item in json.loads(r.stdout)["install"]}
    assert "torch" not in chosen and "torch-npu" not in chosen, chosen
    assert chosen.get("torchtitan-npu") == "0.2.2.post2", chosen
