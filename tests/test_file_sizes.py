"""No tracked source or doc file is over 600 lines.

A file that long mixes several subjects; past the limit it is split by subject (a generated table goes into
its own doc, a module into the parts a reader looks for separately). The files are the ones git tracks
(``git ls-files``), so build output, the virtual environment and anything untracked are never counted;
third-party folders are skipped by name.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 600
SUFFIXES = (".py", ".cpp", ".h", ".md")
SKIPPED_FOLDERS = {".venv", "build", "third_party", "third-party", "vendor"}


def _checked(paths: list[str]) -> list[str]:
    return [p for p in paths if p.endswith(SUFFIXES) and not SKIPPED_FOLDERS.intersection(p.split("/")[:-1])]


def _too_long(root: str, paths: list[str]) -> dict[str, int]:
    long = {}
    for path in paths:
        full = os.path.join(root, path)
        if not os.path.isfile(full):  # tracked but deleted in the work tree: nothing to read
            continue
        with open(full, encoding="utf-8", errors="replace") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long[path] = n
    return long


def _tracked() -> list[str]:
    if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [p for p in out.decode("utf-8").split("\0") if p]


def test_no_tracked_source_or_doc_file_is_over_600_lines():
    paths = _checked(_tracked())
    assert paths, "git ls-files listed no source or doc file"
    long = _too_long(ROOT, paths)
    assert not long, "files over %d lines (split them by subject): %s" % (
        MAX_LINES, ", ".join(f"{p} ({n} lines)" for p, n in sorted(long.items())))


def test_the_check_sees_a_long_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "long.md").write_text("x\n" * (MAX_LINES + 1), encoding="utf-8")
    (tmp_path / "docs" / "limit.md").write_text("x\n" * MAX_LINES, encoding="utf-8")
    paths = _checked(["docs/long.md", "docs/limit.md", "build/gen.py", "third_party/lib.h", "data.json",
                      "device_core/graph/graph_external_event.cpp"])
    assert paths == ["docs/long.md", "docs/limit.md", "device_core/graph/graph_external_event.cpp"]
    assert _too_long(str(tmp_path), paths) == {"docs/long.md": MAX_LINES + 1}
