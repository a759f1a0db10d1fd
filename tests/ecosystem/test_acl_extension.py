"""An ACL extension (examples/acl_extension) built against the CANN home: its ACL calls run on torch's npu
streams in order with torch kernels, its aclrtMalloc memory is an npu tensor, its errors are ACL codes."""
import os
import sys

import pytest
import torch

from example_build import REPO, build_example

sys.path.insert(0, os.path.join(REPO, "tests"))
from runtime_ext import HostGate  # noqa: E402

EXAMPLE = os.path.join(REPO, "examples", "acl_extension")
BUILD_TIMEOUT = 500  # s; well under a minute on an idle 2-core machine


@pytest.fixture(scope="module")
def acl_ext(tmp_path_factory):
    return build_example(EXAMPLE, str(tmp_path_factory.mktemp("acl_ext")), BUILD_TIMEOUT)


def _blocking_launch() -> bool:
    """ASCEND_LAUNCH_BLOCKING=1 (NPUDIST_LAUNCH_BLOCKING wins): ops run inline, a closed stream would block them."""
    value = os.environ.get("NPUDIST_LAUNCH_BLOCKING", os.environ.get("ASCEND_LAUNCH_BLOCKING", "0"))
    return value == "1"


@pytest.mark.timeout(BUILD_TIMEOUT + 60)
def test_acl_copy_is_ordered_with_torch_kernels_on_the_stream(acl_ext):
    x = torch.randn(1 << 16, device="npu")
    # A signature's first call runs synchronously (it drains the stream): run both kernels once before gating.
    (x * 2) + 1
    torch.npu.synchronize()
    for stream in (torch.npu.current_stream(), torch.npu.Stream()):
        with torch.npu.stream(stream):
            gate = None if _blocking_launch() else HostGate(0, stream.stream_id)  # holds the stream closed
            y = x * 2                               # torch kernel, queued behind the gate
            z = torch.ops.aclops.copy(y)            # aclrtMemcpyAsync on the same stream
            w = z + 1                               # torch kernel after the ACL copy
            before = torch.ops.aclops.ticks()
            torch.ops.aclops.tick()                 # aclrtLaunchHostFunc behind all of them
            if gate is not None:
                assert torch.ops.aclops.ticks() == before  # nothing ran yet: the ACL work is queued, not done
                gate.open()
            stream.synchronize()
        assert torch.ops.aclops.ticks() == before + 1
        assert torch.equal(w.cpu(), x.cpu() * 2 + 1)


@pytest.mark.timeout(BUILD_TIMEOUT + 60)
def test_acl_memory_is_npu_memory_and_errors_are_acl_codes(acl_ext):
    t = torch.ops.aclops.acl_full(1000, 1.5, 1)   # aclrtMalloc + staged copy + host function
    assert t.device == torch.device("npu:1")
    assert torch.equal((t * 2).cpu(), torch.full((1000,), 3.0))  # torch kernels read the ACL block
    del t
    with pytest.raises(RuntimeError, match=r"aclrtMemcpyAsync failed with ACL error 100000: aclrtMemcpyAsync: "
                                           r"count 4096 exceeds destMax 8"):
        torch.ops.aclops.copy_into(torch.empty(2, device="npu"), torch.empty(1024, device="npu"))
    with pytest.raises(RuntimeError,
                       match=r"aclrtSynchronizeStream failed with ACL error 100000: .*not a stream handle"):
        torch.ops.aclops.sync_bad_stream()
    with pytest.raises(RuntimeError,
                       match=r"aclrtSetDevice failed with ACL error 107001: .*Invalid npu device index 99"):
        torch.ops.aclops.acl_full(4, 1.0, 99)
