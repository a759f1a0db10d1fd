"""Build the example ACL extension against the CANN home and run its operators.

    python examples/acl_extension/run.py      # first build compiles (tens of seconds), then cached

The build takes its headers and libraries from $ASCEND_HOME_PATH (include/, lib64/libascendcl.so) and the
torch_npu package (include/, lib/libtorch_npu.so), as Ascend extensions do; with npudist, importing torch_npu
sets ASCEND_HOME_PATH to npudist's emulated CANN home when no real toolkit is configured (docs/cann.md).
"""
import os

import torch
import torch_npu  # noqa: F401  (the npu device; sets ASCEND_HOME_PATH when no CANN toolkit is configured)
from torch.utils.cpp_extension import load

import npudist.cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))


def build(build_directory: str | None = None) -> str:
    """Compile (or reuse the cached build of) the example and load it: its operators appear as torch.ops.aclops.*."""
    home = os.environ["ASCEND_HOME_PATH"]
    torch_npu_dir = os.path.dirname(os.path.abspath(torch_npu.__file__))
    return load(name="acl_ops", sources=[os.path.join(HERE, "acl_ops.cpp")],
                extra_include_paths=[os.path.join(home, "include"), os.path.join(torch_npu_dir, "include")]
                + npudist.cpp_extension.include_paths(),
                extra_ldflags=[f"-L{os.path.join(home, 'lib64')}", "-lascendcl",
                               f"-L{os.path.join(torch_npu_dir, 'lib')}", "-ltorch_npu"],
                build_directory=build_directory, extra_cflags=["-O2"], is_python_module=False, verbose=False)


if __name__ == "__main__":
    build()
    x = torch.randn(6, device="npu")
    y = torch.ops.aclops.copy(x * 2) + 1  # torch kernel -> ACL copy -> torch kernel, one stream
    print("ACL copy in order with torch ops:", torch.equal(y.cpu(), x.cpu() * 2 + 1))
    print("aclrtMalloc'ed npu tensor:", torch.ops.aclops.acl_full(4, 1.5, 0))
    try:
        torch.ops.aclops.copy_into(torch.empty(2, device="npu"), x)
    except RuntimeError as e:
        print("ACL error:", str(e).splitlines()[0])
