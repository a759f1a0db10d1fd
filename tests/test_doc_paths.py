"""Every repository file or folder the docs name exists.

A path counts when it is written in backticks or as a Markdown link target and starts with one of the
repository's top-level folders (``device_core/launch/launch.cpp``, ``docs/hccl.md``). A C++ include name
(``npudist/runtime_c_api.h``) also resolves through the include folders the extensions are built with.
Globs, placeholders (``<N>``) and elisions (``...``) are not paths.
"""
from __future__ import annotations

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "BENCHMARKS.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/docs/*.md"))]
INCLUDE_DIRS = ["npudist/include", "device_core/include", "torch_npu/include", "npudist/hccl/csrc/include"]
_CANDIDATE = re.compile(r"`([A-Za-z0-9_./\-]+)`|\]\(([A-Za-z0-9_./\-]+)(?:#[^)]*)?\)")


def _named_paths(text: str, tops: set[str]) -> set[str]:
    found = set()
    for m in _CANDIDATE.finditer(text):
        path = (m.group(1) or m.group(2)).rstrip("/")
        if "/" in path and path.split("/")[0] in tops and "..." not in path:
            found.add(path)
    return found


def _exists(path: str) -> bool:
    return any(os.path.exists(os.path.join(ROOT, base, path)) for base in ["", *INCLUDE_DIRS])


def test_every_path_a_doc_names_exists():
    tops = {d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d)) and not d.startswith(".")}
    missing = {}
    for doc in DOCS:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            text = f.read()
        gone = sorted(p for p in _named_paths(text, tops) if not _exists(p))
        if gone:
            missing[doc] = gone
    assert not missing, f"docs name files that do not exist: {missing}"


def test_the_check_sees_a_missing_path():
    tops = {"device_core", "docs"}
    named = _named_paths("see `device_core/no_such_file.cpp` and [hccl](docs/hccl.md#top), not `a/b`", tops)
    assert named == {"device_core/no_such_file.cpp", "docs/hccl.md"}
    assert not _exists("device_core/no_such_file.cpp") and _exists("docs/hccl.md")
