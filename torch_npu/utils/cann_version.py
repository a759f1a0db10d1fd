"""``get_cann_version(module)``: the version of the CANN toolkit under ``ASCEND_HOME_PATH`` (docs/cann.md)."""
from __future__ import annotations

import os

_MODULES = ("CANN", "RUNTIME", "COMPILER", "HCCL", "TOOLKIT", "OPP", "OPP_KERNEL", "DRIVER")


def get_cann_version(module: str = "CANN") -> str:
    """``version=`` of ``$ASCEND_HOME_PATH/ascend_toolkit_install.info`` for CANN and TOOLKIT; for a component,
    its ``<home>/<component>/version.info`` (``""`` when the home has no such component, as the emulated home
    has none besides the toolkit: its ACL runtime is npudist's)."""
    if module not in _MODULES:
        raise ValueError(f"get_cann_version: module must be one of {list(_MODULES)}, got {module!r}")
    home = os.environ.get("ASCEND_HOME_PATH", "")
    if not home:
        import npudist.cann.environment as env  # noqa: PLC0415 - the emulated home when none is configured
        home = env.HOME
    path = (os.path.join(home, "ascend_toolkit_install.info") if module in ("CANN", "TOOLKIT")
            else os.path.join(home, module.lower(), "version.info"))
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key in ("version", "Version"):
                    return value
    except OSError:
        pass
    return ""
