"""Build of npudist's two C++ extensions against the *installed* torch.

Use ``pip install --no-build-isolation -e .`` (or ``scripts/setup.sh``) so the build sees torch==2.13.0
from the environment instead of downloading another torch into an isolated build env.

* ``npudist._C``       -- the npu device core (``device_core/``): allocator, streams, guard, kernels, RNG.
* ``npudist.hccl._C``  -- ProcessGroupHCCL adapter (``npudist/hccl/csrc``) + the torch-free collective
                          engine (``npudist/hccl/engine``).

Environment:
  NPUDIST_BUILD_ONLY=device|hccl   build one extension only (developer iteration).
  NPUDIST_SKIP_EXT=1               install the Python package without building extensions
                                   (``scripts/setup.sh`` then builds them incrementally in place).
  NPUDIST_DEBUG_INFO=1             keep debug info (-g) in the extensions (off by default: halves build time).
  MAX_JOBS                         parallel compile jobs (ninja); defaults to the core count.
"""
import glob
import os

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
# -g0 overrides the -g that Python's own CFLAGS put first on the command line: debug info for torch's
# headers doubled the compile time of every torch-including file and made its object file ~30x larger
# (BENCHMARKS.md, "Build"). Build with NPUDIST_DEBUG_INFO=1 to keep it (gdb on the extensions).
CXX_FLAGS = ["-O3", "-std=c++17", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"] + (
    [] if os.environ.get("NPUDIST_DEBUG_INFO") == "1" else ["-g0"])


def _sources(*patterns):
    out = []
    for p in patterns:
        out += sorted(glob.glob(os.path.join(HERE, p)))
    return [os.path.relpath(s, HERE) for s in out]


def _kineto_include():
    """torch ships Kineto's plugin headers (IActivityProfiler.h, ...) in include/kineto."""
    from torch.utils.cpp_extension import include_paths

    return [os.path.join(p, "kineto") for p in include_paths() if os.path.isdir(os.path.join(p, "kineto"))]


def _extensions():
    if os.environ.get("NPUDIST_SKIP_EXT") == "1":
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    only = os.environ.get("NPUDIST_BUILD_ONLY", "")
    exts = []
    if only in ("", "device"):
        exts.append(CppExtension(
            "npudist._C",
            _sources("device_core/*.cpp", "device_core/allocator/*.cpp"),
            include_dirs=[os.path.join(HERE, "device_core/include"), os.path.join(HERE, "device_core")]
            + _kineto_include(),
            # USE_KINETO: torch's privateuse1_profiler.h (the npu activity source) is guarded by it.
            extra_compile_args=CXX_FLAGS + ["-DUSE_KINETO"],
            extra_link_args=["-lrt"],
        ))
    if only in ("", "hccl"):
        exts.append(CppExtension(
            "npudist.hccl._C",
            _sources("npudist/hccl/csrc/*.cpp", "npudist/hccl/engine/*.cpp"),
            include_dirs=[os.path.join(HERE, "npudist/hccl/engine"), os.path.join(HERE, "device_core/include")],
            extra_compile_args=CXX_FLAGS,
            extra_link_args=["-lrt", "-lpthread"],
        ))
    return exts, {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()

setup(
    packages=["npudist", "torch_npu"] + ["npudist." + p for p in (
        "compile", "device", "hccl", "ops", "fsdp", "tp", "pp", "plan", "mesh", "models", "data", "train", "launch")] + [
        "torch_npu.contrib", "torch_npu.distributed", "torch_npu.profiler"],
    package_data={"npudist": ["include/npudist/*.h"]},  # <npudist/extension.h> for user C++ extensions
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
