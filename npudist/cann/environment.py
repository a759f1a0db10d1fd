"""Choose the CANN home and set the variables CANN's ``set_env.sh`` sets (registration-level work: a few
environment reads and writes, no imports beyond the standard library).

A real toolkit wins: if ``ASCEND_HOME_PATH`` is already set to anything but the emulated home, nothing is changed.
Otherwise the process (and its children) get::

    ASCEND_HOME_PATH=ASCEND_TOOLKIT_HOME=<npudist>/cann/home
    LD_LIBRARY_PATH += <home>/lib64           (children that load extensions linked with -lascendcl)
    PYTHONPATH      += <home>/python/site-packages   (children: ``import acl``)

and this process's ``sys.path`` gets the home's ``python/site-packages`` (appended: an ``acl`` earlier on the
path, a real pyACL, wins). ``ASCEND_OPP_PATH`` / ``ASCEND_AICPU_PATH`` are not set: the emulated home has no
operator packages, and tools that find the variable would look for them.
"""
from __future__ import annotations

import os
import sys

HOME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "home")
LIB64 = os.path.join(HOME, "lib64")
PYTHON_DIR = os.path.join(HOME, "python", "site-packages")
TORCH_NPU_LIB = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                             "torch_npu", "lib")


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def is_emulated_home(path: str | None = None) -> bool:
    """Whether ``path`` (default: ``$ASCEND_HOME_PATH``) is this emulated home."""
    path = os.environ.get("ASCEND_HOME_PATH") if path is None else path
    return bool(path) and _same_path(path, HOME)


def _append_path_var(name: str, entry: str) -> str:
    parts = [p for p in os.environ.get(name, "").split(os.pathsep) if p]
    if not any(_same_path(p, entry) for p in parts):
        parts.append(entry)
    return os.pathsep.join(parts)


def emulated_environment() -> dict[str, str]:
    """The variables (with their new values) that select the emulated home, as ``set_env.sh`` would."""
    return {
        "ASCEND_HOME_PATH": HOME,
        "ASCEND_TOOLKIT_HOME": HOME,
        "LD_LIBRARY_PATH": _append_path_var("LD_LIBRARY_PATH", LIB64),
        "PYTHONPATH": _append_path_var("PYTHONPATH", PYTHON_DIR),
    }


def configure() -> bool:
    """Select the emulated home unless a real one is configured. Returns True if the emulated home is in use."""
    current = os.environ.get("ASCEND_HOME_PATH")
    if current and not is_emulated_home(current):
        return False
    os.environ.update(emulated_environment())
    if not any(_same_path(p, PYTHON_DIR) for p in sys.path if p):
        sys.path.append(PYTHON_DIR)
    return True


_loaded = False


def load_libraries() -> None:
    """Load torch_npu/lib/libtorch_npu.so (and through it libascendcl.so) into this process when the emulated home
    is in use, as importing Ascend's torch_npu loads its libraries: an extension linked with ``-lascendcl
    -ltorch_npu`` and no rpath (DeepSpeed's NPU op builders) then resolves them by soname when Python loads it.
    A missing library (not built) is a RuntimeWarning naming the fix, not an error: torch works without it."""
    global _loaded
    if _loaded or not is_emulated_home():
        return
    import ctypes

    lib = os.path.join(TORCH_NPU_LIB, "libtorch_npu.so")
    try:
        ctypes.CDLL(lib)
    except OSError as e:
        import warnings

        warnings.warn(f"npudist: the emulated CANN libraries are not loaded ({e}); extensions linked with "
                      "-lascendcl/-ltorch_npu will not load. Build them: scripts/setup.sh or "
                      "python -m npudist.cann.build", RuntimeWarning, stacklevel=2)
    _loaded = True
