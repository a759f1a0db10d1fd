"""torch_npu.empty_with_swapped_memory, modelled on torch_npu's documented example and its swapped-memory
allocator tests: npu tensors over host memory outside the device budget, the documented operators, and a
clear error for any other operator."""
import pytest
import torch

import torch_npu
from _subproc import check_snippet


def test_documented_example():
    swapped = torch_npu.empty_with_swapped_memory([2, 2], dtype=torch.float32, device=torch.device("npu:0"))
    assert swapped.device == torch.device("npu:0") and swapped.dtype == torch.float32 and swapped.shape == (2, 2)
    assert torch.npu.memory._is_swapped(swapped)
    tmp = swapped.fill_(3.14)
    assert tmp is swapped
    out = torch.empty_like(swapped).fill_(1).mul_(tmp)
    assert type(out) is torch.Tensor and not torch.npu.memory._is_swapped(out)
    assert torch.equal(out.cpu(), torch.full((2, 2), 3.14))
    assert repr(swapped) == repr(out)                            # prints like a plain npu tensor


def test_outside_the_device_budget():
    # 96 MiB of swapped memory on a 64 MiB device: not counted by the allocator, not limited by the capacity.
    out = check_snippet("""
        import torch, torch_npu
        before = torch.npu.memory_allocated()
        t = torch_npu.empty_with_swapped_memory([96, 1024, 1024], dtype=torch.uint8)
        t.fill_(7)
        print("ALLOC", torch.npu.memory_allocated() - before, torch.npu.memory_reserved())
        print("SWAPPED", torch.npu.memory._swapped_memory_bytes())
        del t
        print("FREED", torch.npu.memory._swapped_memory_bytes())
        try:
            torch.empty(96, 1024, 1024, dtype=torch.uint8, device="npu")
        except torch.OutOfMemoryError:
            print("DEVICE_OOM")
    """, {"NPUDIST_DEVICE_MEMORY": str(64 << 20)})
    assert "ALLOC 0 0" in out and f"SWAPPED {96 << 20}" in out and "FREED 0" in out and "DEVICE_OOM" in out


def test_supported_ops_match_regular_tensors():
    s = torch_npu.empty_with_swapped_memory([8]).zero_()
    assert torch.equal(torch.empty_like(s).fill_(1).mul_(s).cpu(), torch.zeros(8))
    s.fill_(torch.tensor(2.0, device="npu")).mul_(3)
    s.mul_(torch.arange(8.0, device="npu"))
    assert torch.equal(torch.empty_like(s).fill_(1).mul_(s).cpu(), torch.arange(8.0) * 6)
    # npu_apply_adam_w with swapped optimizer state gives the regular tensors' result.
    grad = torch.linspace(-1, 1, 8, device="npu")
    ref = [torch.ones(8, device="npu"), torch.zeros(8, device="npu"), torch.zeros(8, device="npu")]
    var = torch.ones(8, device="npu")
    m = torch_npu.empty_with_swapped_memory([8]).zero_()
    v = torch_npu.empty_with_swapped_memory([8]).zero_()
    for _ in range(2):
        torch_npu.npu_apply_adam_w(0.9, 0.999, 0.01, 0.1, 0.9, 0.999, 1e-8, grad, None, False, False, out=ref)
        torch_npu.npu_apply_adam_w(0.9, 0.999, 0.01, 0.1, 0.9, 0.999, 1e-8, grad, None, False, False,
                                   out=(var, m, v))
    assert torch.equal(var.cpu(), ref[0].cpu())
    assert torch.equal(torch.empty_like(m).fill_(1).mul_(m).cpu(), ref[1].cpu())


@pytest.mark.parametrize("op, name", [
    (lambda t: t + 1, "aten::add.Tensor"),
    (lambda t: t.sum(), "aten::sum"),
    (lambda t: t.cpu(), "aten::_to_copy"),
    (lambda t: t.copy_(torch.ones(4, device="npu")), "aten::copy_"),
    (lambda t: t.view(2, 2), "aten::view"),
    (lambda t: t.resize_(100), "aten::resize_"),
    (lambda t: torch.ones(4, device="npu").add_(t), "aten::add_.Tensor"),
])
def test_other_ops_raise_naming_the_op(op, name):
    t = torch_npu.empty_with_swapped_memory([4]).zero_()
    with pytest.raises(RuntimeError, match=rf"{name} is not supported on a tensor allocated by "
                                           r"torch_npu.empty_with_swapped_memory"):
        op(t)


def test_bad_arguments():
    with pytest.raises(ValueError, match="negative dimension"):
        torch_npu.empty_with_swapped_memory([2, -1])
    with pytest.raises(ValueError, match="npu device"):
        torch_npu.empty_with_swapped_memory([2], device="cpu")
    with pytest.raises(TypeError, match="dtype"):
        torch_npu.empty_with_swapped_memory([2], dtype="float32")
    t = torch_npu.empty_with_swapped_memory(3, dtype=torch.float16, device=1)
    assert t.shape == (3,) and t.dtype == torch.float16 and t.device == torch.device("npu:1")
