"""docs/environment.md lists every environment variable the code reads: Python and C++ sources of npudist,
device_core, torch_npu and setup.py are scanned for reads (os.environ, getenv, the C++ env_* helpers,
npudist.env.read) and for variable names of npudist's families written as string literals (names read through
a variable, as in a loop over names)."""
from __future__ import annotations

import os
import re

from npudist import env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCANNED = ("npudist", "device_core", "torch_npu", "setup.py")
NAME = r"([A-Z][A-Z0-9_]*[A-Z0-9])"
READS = [re.compile(p.replace("NAME", NAME)) for p in (
    r'os\.environ\.get\(\s*"NAME"', r'os\.environ\[\s*"NAME"\s*\]', r'getenv\(\s*"NAME"',
    r'"NAME"\s+(?:not\s+)?in\s+(?:_?os\.)?environ', r'\benv\.read\(\s*"NAME"', r'\benv_\w+\(\s*"NAME"',
    r'_append_path_var\(\s*"NAME"', r'^\s*(?:AUTOLOAD|\w+_ENV)\s*=\s*"NAME"')]
FAMILY = re.compile(r'"((?:NPUDIST|HCCL|ASCEND|TORCH_HCCL|PYTORCH_NPU|PYTORCH_NO_NPU|OOM_SNAPSHOT)_[A-Z0-9_]*[A-Z0-9])"')


def _sources(skip: str = ""):
    for top in SCANNED:
        path = os.path.join(REPO, top)
        if os.path.isfile(path):
            yield path
            continue
        for d, _, files in os.walk(path):
            yield from (os.path.join(d, f) for f in files if f.endswith((".py", ".cpp", ".h", ".cc"))
                        and os.path.join(d, f) != os.path.join(REPO, skip))


def variables_read(skip: str = "") -> dict[str, str]:
    """Variable name -> one file that reads it (``skip``: a file not to scan)."""
    found = {}
    for path in _sources(skip):
        with open(path, errors="replace") as f:
            text = f.read()
        for rx in READS + [FAMILY]:
            for m in rx.finditer(text) if rx is FAMILY else re.finditer(rx.pattern, text, re.M):
                found.setdefault(m.group(1), os.path.relpath(path, REPO))
    return found


def documented() -> set[str]:
    with open(os.path.join(REPO, "docs", "environment.md")) as f:
        rows = [ln for ln in f if ln.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split(" | ")[0])}


def test_the_scan_finds_reads_of_every_kind():
    found = variables_read()
    # getenv in C++, env_kib helper, a name in a loop, os.environ.get, a module constant, a dynamic path list
    for name in ("NPUDIST_DEVICE_COUNT", "NPUDIST_ENGINE_CHUNK_KB", "NPUDIST_LAUNCH_BLOCKING", "PYTHON_EXEC",
                 "TORCH_DEVICE_BACKEND_AUTOLOAD", "LD_LIBRARY_PATH"):
        assert name in found, name


def test_every_variable_read_in_the_code_is_in_the_table():
    missing = {name: path for name, path in variables_read().items() if name not in documented()}
    assert not missing, f"read in the code but not in docs/environment.md: {missing}"


def test_every_checked_variable_is_in_the_table_and_read_somewhere():
    assert set(env.VARIABLES) <= documented()
    unread = set(env.VARIABLES) - set(variables_read(skip="npudist/env.py"))
    assert not unread, f"npudist/env.py checks variables nothing else reads: {sorted(unread)}"
