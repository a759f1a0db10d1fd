"""Storage formats as tags on the emulated npu: npu_format_cast (both overloads), npu_format_cast_ (both),
empty_with_format and get_npu_format, following the documented examples; values and gradients are unchanged."""
import pytest
import torch

import torch_npu
from tests.ops._common import NPU, leaf, ops, ref_leaf

NZ = 29


@pytest.mark.timeout(60)
def test_documented_examples():
    x = torch.rand(2, 3, 4, 5).npu()
    assert torch_npu.get_npu_format(x) == 0  # a fresh 4-D tensor is NCHW
    x1 = torch_npu.npu_format_cast(x, NZ)
    assert torch_npu.get_npu_format(x1) == NZ and str(torch_npu.get_npu_format(x1)) == "FRACTAL_NZ"
    assert ops.get_npu_format(x1) == NZ  # the operator form returns the int
    assert x1 is not x and torch.equal(x1.cpu(), x.cpu())
    assert torch_npu.get_npu_format(x) == 0  # the source keeps its format
    y = torch_npu.npu_format_cast_(x, NZ)
    assert y is x and torch_npu.get_npu_format(x) == NZ
    assert torch_npu.get_npu_format(x[0]) == NZ  # a view reports its base's format
    e = torch_npu.empty_with_format((2, 3), dtype=torch.float32, device="npu")
    assert e.shape == (2, 3) and e.dtype == torch.float32 and e.device.type == "npu"
    assert torch_npu.get_npu_format(e) == 2  # ND, the default
    assert torch_npu.get_npu_format(torch.ones(3, device=NPU)) == 2
    assert torch_npu.get_npu_format(torch.ones(1, 2, 3, 4, 5, device=NPU)) == 30  # NCDHW


@pytest.mark.timeout(60)
def test_tensor_overloads_copy_another_tensors_format():
    src = torch_npu.empty_with_format((4, 4), dtype=torch.float16, device=NPU, acl_format=NZ)
    assert torch_npu.get_npu_format(src) == NZ
    a = torch.randn(4, 4, device=NPU)
    b = ops.npu_format_cast.Tensor(a, src)
    assert torch_npu.get_npu_format(b) == NZ and b.dtype == torch.float32
    c = torch.randn(4, 4, device=NPU)
    assert ops.npu_format_cast_(c, src) is c and torch_npu.get_npu_format(c) == NZ


@pytest.mark.timeout(60)
def test_math_and_gradients_are_unchanged_by_a_format():
    torch.manual_seed(0)
    x, w = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    xn, wn = leaf(x), leaf(w)
    xr, wr = ref_leaf(x), ref_leaf(w)
    out = xn @ torch_npu.npu_format_cast(wn, NZ)
    ref = xr @ wr
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    g = torch.randn(3, 5, dtype=torch.float64)
    got = torch.autograd.grad(out, (xn, wn), g.to(NPU))
    want = torch.autograd.grad(ref, (xr, wr), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call,match", [
    (lambda: torch_npu.npu_format_cast(torch.ones(2, 2, device=NPU), 99), "npu_format_cast: acl_format 99"),
    (lambda: torch_npu.npu_format_cast(torch.ones(2, 2, device=NPU), 0), "NCHW describes 4-D"),
    (lambda: torch_npu.npu_format_cast_(torch.ones(3, device=NPU), NZ), "npu_format_cast_: format FRACTAL_NZ"),
    (lambda: torch_npu.empty_with_format((2, 2), device="cpu"), "empty_with_format: formats describe npu"),
    (lambda: torch_npu.empty_with_format((2, 2), device=NPU, acl_format=-3), "empty_with_format: acl_format"),
    (lambda: torch_npu.get_npu_format(torch.ones(2)), "get_npu_format"),
])
def test_format_invalid_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.timeout(300)
def test_format_ops_compile_fullgraph():
    def fn(x, w):
        w_nz = torch_npu.npu_format_cast(w, NZ)
        buf = torch_npu.empty_with_format((2, 2), dtype=x.dtype, device=x.device, acl_format=NZ)
        torch_npu.npu_format_cast_(buf, 2)
        return (x @ w_nz).sum() + buf.zero_().sum()

    x, w = torch.randn(3, 4), torch.randn(4, 2)
    wc, we = leaf(w), leaf(w)
    lc = torch.compile(fn, fullgraph=True, backend="aot_eager")(x.to(NPU), wc)
    le = fn(x.to(NPU), we)
    torch.testing.assert_close(lc.detach().cpu(), le.detach().cpu())
    lc.backward()
    le.backward()
    torch.testing.assert_close(wc.grad.cpu(), we.grad.cpu())
