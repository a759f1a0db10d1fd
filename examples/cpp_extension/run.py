"""Build the example extension with torch.utils.cpp_extension and run its npu kernel.

    python examples/cpp_extension/run.py          # first build compiles (tens of seconds), then cached
"""
import os

import torch
from torch.utils.cpp_extension import load

import npudist  # noqa: F401  (registers the npu device before the extension's kernels are used)
import npudist.cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))


def build(build_directory: str | None = None) -> str:
    """Compile (or reuse the cached build of) the example and load it: its operators appear as torch.ops.myops.*.

    Returns the path of the shared library."""
    return load(name="npu_scaled_add", sources=[os.path.join(HERE, "npu_scaled_add.cpp")],
                extra_include_paths=npudist.cpp_extension.include_paths(), build_directory=build_directory,
                extra_cflags=["-O2"], is_python_module=False, verbose=False)


if __name__ == "__main__":
    build()
    x, y = torch.randn(5, device="npu"), torch.randn(5, device="npu")
    out = torch.ops.myops.scaled_add(x, y, 2.0)
    print("npu result:", out)
    print("matches x + 2 y:", torch.allclose(out.cpu(), x.cpu() + 2 * y.cpu()))
