"""An environment as a new user's shell has it: none of the CANN variables npudist's import sets (the test process
imported npudist, which set them in os.environ), so a child proves that it finds the emulated home by itself."""
import os

from npudist.cann import environment

CANN_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
ADDED_PATHS = {"LD_LIBRARY_PATH": environment.LIB64, "PYTHONPATH": environment.PYTHON_DIR}


def clear_cann_environment(monkeypatch) -> None:
    """Remove from os.environ (for the test's duration) what npudist's CANN configuration added."""
    for var in CANN_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, entry in ADDED_PATHS.items():
        kept = [p for p in os.environ.get(var, "").split(os.pathsep)
                if p and os.path.realpath(p) != os.path.realpath(entry)]
        if kept:
            monkeypatch.setenv(var, os.pathsep.join(kept))
        else:
            monkeypatch.delenv(var, raising=False)
