"""npu's Inductor codegen config: what makes npudist's part of compiled code part of Inductor's cache keys.

Inductor and AOTAutograd key their on-disk caches on torch's sources and configs, not on npudist's. npudist
changes what gets compiled for npu (the tracing-time attention kernel, the CPU-parity lowerings, the wrapper
codegen), so a cache written by another npudist version could hand back stale code. This module is passed to
``register_backend_for_device(..., device_custom_config=...)``, whose saved values join both cache keys;
``sources_fingerprint`` hashes the sources of :mod:`npudist.compile`.
"""
import hashlib
import pathlib
import sys

from torch.utils._config_module import install_config_module


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


sources_fingerprint: str = _fingerprint()

install_config_module(sys.modules[__name__])
