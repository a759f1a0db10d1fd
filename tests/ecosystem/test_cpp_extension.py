"""A user's C++ extension (examples/cpp_extension) registers a PrivateUse1 kernel with <npudist/extension.h>:
built once per session (niced, in a temporary directory), then run on npu tensors."""
import os

import pytest
import torch

from example_build import REPO, build_example

EXAMPLE = os.path.join(REPO, "examples", "cpp_extension")
BUILD_TIMEOUT = 500  # s; the build takes well under a minute on an idle 2-core machine


@pytest.fixture(scope="session")
def example_ext(tmp_path_factory):
    return build_example(EXAMPLE, str(tmp_path_factory.mktemp("npu_cpp_ext")), BUILD_TIMEOUT)


@pytest.mark.timeout(BUILD_TIMEOUT + 60)
def test_user_extension_kernel_runs_on_npu(example_ext):
    x, y = torch.randn(3, 4, device="npu:1"), torch.randn(3, 4, device="npu:1")
    out = torch.ops.myops.scaled_add(x, y.t().contiguous().t(), 0.5)  # non-contiguous y
    assert out.device == torch.device("npu:1")
    torch.testing.assert_close(out.cpu(), x.cpu() + 0.5 * y.cpu())
    # The kernel sees x's device through its guard (current device is 0 here), and the caller's stream.
    assert torch.npu.current_device() == 0
    s = torch.npu.Stream(device=1)
    with torch.npu.stream(s):
        dev, stream_id, alloc_dev = torch.ops.myops.probe(x)
    assert (dev, alloc_dev) == (1, 1) and stream_id == s.stream_id
    assert torch.npu.current_device() == 0  # guard restored
    with pytest.raises(RuntimeError, match="myops::scaled_add: x must be an npu tensor"):
        torch.ops.myops.scaled_add(torch.randn(2).npu().cpu(), torch.randn(2, device="npu"), 1.0)
