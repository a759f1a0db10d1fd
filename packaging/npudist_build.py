"""npudist's PEP 517 build backend: setuptools' own, plus the two files a wheel cannot carry as package data.

``pyproject.toml`` names it (``build-backend = "npudist_build"``, ``backend-path = ["packaging"]``), so
``pip install .``, ``pip install -e .``, ``pip wheel .`` and ``python -m build`` all give the complete install:

* ``npudist_cann_acl.pth`` at the root of site-packages: one path line that makes the emulated pyACL
  (``npudist/cann/home/python/site-packages``) importable as ``import acl``, the way CANN's ``set_env.sh`` puts
  the real one on ``PYTHONPATH``. A real toolkit's ``PYTHONPATH`` entry comes earlier on ``sys.path`` and wins.
  In a wheel the line is relative to site-packages; in an editable wheel it is the checkout's absolute path.
* ``torch_npu-<version>.dist-info``: the distribution metadata of npudist's ``torch_npu`` package, installed into
  site-packages through the wheel's ``.data/purelib`` folder. Libraries detect Ascend by it
  (``importlib.metadata.version("torch_npu")``), and pip's resolver sees ``torch_npu`` as installed, so
  ``pip install torchtitan-npu`` does not fetch Huawei's torch_npu together with another torch. Why not a second
  wheel: one ``pip install`` of one wheel must give the whole product, and pip refuses a wheel with two
  ``.dist-info`` folders at its root; ``.data/purelib`` is the wheel format's own way to place files in
  site-packages. ``pip uninstall npudist`` removes it with the rest.

Everything else (extensions, the emulated CANN libraries, headers, commands) is ordinary setuptools work in
``setup.py``.
"""
from __future__ import annotations

import base64
import glob
import hashlib
import os
import shutil
import zipfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (re-exported hooks: PEP 517 looks them up by name)
    build_sdist, get_requires_for_build_editable, get_requires_for_build_sdist, get_requires_for_build_wheel,
    prepare_metadata_for_build_editable, prepare_metadata_for_build_wheel)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACL_PYTHON = "npudist/cann/home/python/site-packages"
PTH = "npudist_cann_acl.pth"


def torch_npu_version() -> str:
    """torch_npu's version as npudist reports it: torch's release, "+npudist", npudist's version (the same string
    ``torch_npu.__version__`` gives; tests/ecosystem/test_detection.py checks they agree)."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    torch_pin = next(d for d in project["dependencies"] if d.startswith("torch=="))
    return f"{torch_pin.split('==')[1]}+npudist{project['version']}"


def _torch_npu_metadata(npudist_version: str) -> str:
    return "\n".join([
        "Metadata-Version: 2.1",
        "Name: torch_npu",
        f"Version: {torch_npu_version()}",
        "Summary: npudist's torch_npu compatibility package (emulated NPU; the code ships in the npudist wheel)",
        "Requires-Python: >=3.11,<3.12",
        f"Requires-Dist: npudist=={npudist_version}",
        "", ""])


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _add_files(wheel_path: str, pth_line: str) -> None:
    """Append the .pth file and torch_npu's dist-info to a built wheel and to its RECORD."""
    with zipfile.ZipFile(wheel_path) as zf:
        entries = {info.filename: zf.read(info) for info in zf.infolist()}
    dist_info = next(n.split("/")[0] for n in entries if n.endswith(".dist-info/RECORD"))
    npudist_version = dist_info[len("npudist-"):-len(".dist-info")]
    data_dir = dist_info.replace(".dist-info", ".data")
    tn_info = f"torch_npu-{torch_npu_version()}.dist-info"
    tn_meta = _torch_npu_metadata(npudist_version).encode()
    tn_record = "\n".join([_record_line(f"{tn_info}/METADATA", tn_meta), f"{tn_info}/RECORD,,", ""]).encode()
    added = {
        PTH: (pth_line + "\n").encode(),
        f"{data_dir}/purelib/{tn_info}/METADATA": tn_meta,
        f"{data_dir}/purelib/{tn_info}/RECORD": tn_record,
    }
    record_name = f"{dist_info}/RECORD"
    record = entries.pop(record_name).decode().rstrip("\n").split("\n")
    record = [r for r in record if r.split(",")[0] not in added] + [_record_line(p, d) for p, d in added.items()]
    entries.update(added)
    entries[record_name] = ("\n".join(record) + "\n").encode()
    tmp = wheel_path + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():   # RECORD stays last, as the wheel format recommends
            if name != record_name:
                zf.writestr(name, data)
        zf.writestr(record_name, entries[record_name])
    os.replace(tmp, wheel_path)


def _clear_scratch() -> None:
    """Removes setuptools' wheel scratch folder (build/bdist.<platform>/wheel). A build that stopped half-way
    leaves the .dist-info folder there, and every later build of this checkout then fails with
    "[Errno 17] File exists: 'build/bdist.../npudist-<version>.dist-info'". The compiled objects live elsewhere
    (build/temp), so nothing is rebuilt."""
    for scratch in glob.glob(os.path.join(ROOT, "build", "bdist.*", "wheel")):
        shutil.rmtree(scratch, ignore_errors=True)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _clear_scratch()
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    _add_files(os.path.join(wheel_directory, name), ACL_PYTHON)   # relative: site-packages/npudist/...
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _clear_scratch()
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    _add_files(os.path.join(wheel_directory, name), os.path.join(ROOT, ACL_PYTHON))
    return name
