"""Build the emulated CANN home's libraries (plain C++, no torch; seconds): ``home/lib64/libascendcl.so`` and
``torch_npu/lib/libtorch_npu.so``. ``scripts/setup.sh`` runs it; by hand: ``python -m npudist.cann.build``.
Rebuilds only what is older than its sources.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CSRC = os.path.join(HERE, "csrc")
INCLUDES = [os.path.join(HERE, "home", "include"), os.path.join(ROOT, "device_core", "include"), CSRC]
FLAGS = ["-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra"]


def _outdated(target: str, sources: list[str]) -> bool:
    headers = glob.glob(os.path.join(CSRC, "*.h")) + glob.glob(os.path.join(HERE, "home", "include", "acl", "*.h")) + \
        glob.glob(os.path.join(ROOT, "device_core", "include", "npudist", "*.h"))
    if not os.path.exists(target):
        return True
    built = os.path.getmtime(target)
    return any(os.path.getmtime(s) > built for s in sources + headers)


def _link(target: str, sources: list[str], libs: list[str], cxx: str) -> bool:
    """Compile sources into the shared library target if it is out of date. True if it was (re)built."""
    if not _outdated(target, sources):
        return False
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = target + ".tmp"
    cmd = [cxx, *FLAGS, *(f"-I{i}" for i in INCLUDES), "-o", tmp, *sources,
           f"-Wl,-soname,{os.path.basename(target)}", *libs]
    subprocess.run(cmd, check=True)
    os.replace(tmp, target)  # a process that has the old library mapped keeps it
    return True


def build(cxx: str | None = None) -> list[str]:
    """Build both libraries; returns the paths that were rebuilt."""
    cxx = cxx or os.environ.get("CXX", "g++")
    acl = os.path.join(HERE, "home", "lib64", "libascendcl.so")
    torch_npu = os.path.join(ROOT, "torch_npu", "lib", "libtorch_npu.so")
    rebuilt = []
    acl_sources = sorted(glob.glob(os.path.join(CSRC, "acl_*.cpp")))
    if _link(acl, acl_sources, ["-ldl", "-lpthread"], cxx):
        rebuilt.append(acl)
    # libtorch_npu.so needs libascendcl.so (DT_NEEDED), found through an $ORIGIN-relative rpath: torch_npu and
    # npudist are installed side by side (site-packages or this checkout).
    if _link(torch_npu, [os.path.join(CSRC, "torch_npu_lib.cpp")],
             [f"-L{os.path.dirname(acl)}", "-Wl,--no-as-needed", "-lascendcl",
              "-Wl,-rpath,$ORIGIN/../../npudist/cann/home/lib64"], cxx):
        rebuilt.append(torch_npu)
    return rebuilt


def main() -> int:
    try:
        rebuilt = build()
    except subprocess.CalledProcessError as e:
        print(f"building the emulated CANN libraries failed: {' '.join(e.cmd)}", file=sys.stderr)
        return 1
    for path in rebuilt:
        print(f"built {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
