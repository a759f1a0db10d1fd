"""Build support for user C++ extensions with npu kernels (the C++ side: ``<npudist/extension.h>``).

    import npudist, npudist.cpp_extension
    from torch.utils.cpp_extension import load
    ext = load("myops", ["myops.cpp"], extra_include_paths=npudist.cpp_extension.include_paths())

Recipe and example: docs/torch_npu.md, examples/cpp_extension/.
"""
from __future__ import annotations

import os

_INCLUDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def include_paths() -> list[str]:
    """Directories to add to a torch.utils.cpp_extension build for ``#include <npudist/extension.h>``."""
    return [_INCLUDE]
