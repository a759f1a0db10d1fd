"""Tensor properties the zero-copy fallback must honour: conjugate/negative bits and complex dtypes end
to end (bitwise equal to CPU, forward and backward), partial and overlapping views, npu index tensors
where CPU kernels read indices on the host, and a clear error for layouts npu tensors do not have."""
import pytest
import torch

import npudist  # noqa: F401


def _pair(t):
    """The same leaf tensor on cpu and on npu, both requiring grad."""
    return t.clone().requires_grad_(True), t.to("npu").requires_grad_(True)


def _assert_same(cpu, npu):
    assert npu.device.type == "npu"
    assert torch.equal(cpu.resolve_conj().resolve_neg(), npu.cpu().resolve_conj().resolve_neg())


def test_issue_reproducer_multiply_by_lazy_conjugate():
    torch.manual_seed(0)
    angle = torch.randn(8)
    fc_c = torch.polar(torch.ones(8), angle)
    fc_n = torch.polar(torch.ones(8, device="npu"), angle.npu())
    assert fc_n.conj().is_conj()
    _assert_same(torch.ones_like(fc_c) * fc_c.conj(), torch.ones_like(fc_n) * fc_n.conj())


def test_mul_by_conj_forward_and_backward():
    torch.manual_seed(0)
    x_c, x_n = _pair(torch.randn(4, 8, dtype=torch.complex64))
    f_c, f_n = _pair(torch.randn(8, dtype=torch.complex64))
    out_c, out_n = x_c * f_c.conj(), x_n * f_n.conj()
    _assert_same(out_c, out_n)
    g = torch.randn(4, 8, dtype=torch.complex64)
    out_c.backward(g)
    out_n.backward(g.npu())
    _assert_same(x_c.grad, x_n.grad)
    _assert_same(f_c.grad, f_n.grad)


def _rope(x, freqs_cis):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis).flatten(-2).type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_complex_rope_forward_and_backward(dtype):
    torch.manual_seed(0)
    seq, heads, dim = 6, 2, 8
    freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.outer(torch.arange(seq).float(), freqs)
    fc_c = torch.polar(torch.ones_like(angles), angles).view(1, seq, 1, dim // 2)
    fc_n = torch.polar(torch.ones_like(angles).npu(), angles.npu()).view(1, seq, 1, dim // 2)
    assert torch.equal(fc_c, fc_n.cpu())
    x_c, x_n = _pair(torch.randn(2, seq, heads, dim).to(dtype))
    out_c, out_n = _rope(x_c, fc_c), _rope(x_n, fc_n)
    _assert_same(out_c, out_n)
    g = torch.randn_like(out_c)
    out_c.backward(g)
    out_n.backward(g.npu())
    _assert_same(x_c.grad, x_n.grad)


@pytest.mark.parametrize("op", [
    lambda t: t.conj() * 2, lambda t: t.conj().resolve_conj(), lambda t: t.H.contiguous(), lambda t: t.mH @ t,
    lambda t: torch.sgn(t), lambda t: torch.fft.ifft(t), lambda t: torch.fft.hfft(t), lambda t: torch.fft.ihfft(t.real),
    lambda t: torch.linalg.svdvals(t), lambda t: torch.linalg.pinv(t), lambda t: torch.linalg.eigvals(t),
    lambda t: torch.bmm(t.unsqueeze(0), t.conj().unsqueeze(0)), lambda t: t.conj().neg()._neg_view().resolve_neg(),
    lambda t: torch.linalg.lu_solve(*torch.linalg.lu_factor(t), t.conj()),
])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_and_conjugate_ops_equal_cpu(op, dtype):
    torch.manual_seed(0)
    a = torch.randn(4, 4, dtype=dtype)
    _assert_same(op(a), op(a.npu()))


def test_copy_into_conjugate_view_and_negative_view():
    a = torch.randn(5, dtype=torch.complex64)
    src = torch.randn(5, dtype=torch.complex64)
    dst_c, dst_n = a.clone(), a.npu()
    dst_c.conj().copy_(src)
    dst_n.conj().copy_(src.npu())
    _assert_same(dst_c, dst_n)
    r = torch.randn(5)
    assert torch.equal(r.npu()._neg_view().cpu(), -r)


def test_partial_and_overlapping_views_alias_exact_bytes():
    base_c = torch.arange(20.0)
    base_n = base_c.npu()
    for off in (None, 0, 10):
        kw = {} if off is None else {"storage_offset": off}
        _assert_same(torch.as_strided(base_c[5:15], (2, 2), (1, 2), **kw),
                     torch.as_strided(base_n[5:15], (2, 2), (1, 2), **kw))
    # overlapping and zero-strided views read (and reduce over) the same bytes as on CPU
    _assert_same(base_c.as_strided((4, 5), (3, 1), 2).sum(0), base_n.as_strided((4, 5), (3, 1), 2).sum(0))
    _assert_same(base_c[3:4].expand(6, 5) * 2, base_n[3:4].expand(6, 5) * 2)
    _assert_same(base_c.as_strided((3, 3), (0, 1), 7).cumsum(0), base_n.as_strided((3, 3), (0, 1), 7).cumsum(0))


def test_tensor_split_with_npu_indices_and_its_gradient():
    x_c, x_n = _pair(torch.randn(6, 4))
    idx = torch.tensor([1, 4])
    parts_c, parts_n = torch.tensor_split(x_c, idx), torch.tensor_split(x_n, idx.npu())
    assert len(parts_c) == len(parts_n) == 3
    for pc, pn in zip(parts_c, parts_n):
        _assert_same(pc, pn)
    (parts_c[1] * 3).sum().backward()
    (parts_n[1] * 3).sum().backward()
    _assert_same(x_c.grad, x_n.grad)


def test_sparse_and_quantized_raise_naming_the_op():
    x = torch.randn(3, 3, device="npu")
    with pytest.raises(NotImplementedError, match=r"aten::.*sparse.*not supported on npu.*dense and strided"):
        x.to_sparse()
    with pytest.raises(NotImplementedError, match=r"aten::quantize_per_tensor.*quantized"):
        torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)


def test_efficient_zero_gradient_is_an_npu_zero_tensor():
    """sgn of a real input has an 'efficient zero' gradient (a ZeroTensor, no bytes); reading it crashed."""
    x_c, x_n = _pair(torch.randn(5))
    g_c, = torch.autograd.grad(torch.sgn(x_c), x_c, torch.ones(5))
    g_n, = torch.autograd.grad(torch.sgn(x_n), x_n, torch.ones(5, device="npu"))
    _assert_same(g_c, g_n)
    z = torch._efficientzerotensor(3, device="npu")
    assert z._is_zerotensor() and z.device.type == "npu"
    assert torch.equal((z + 2).cpu(), torch.full((3,), 2.0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_cross_entropy_auto_options_match_cpu(dtype):
    """The chunked linear_cross_entropy picks accumulation by device type; npu gets the CPU's picks
    (npudist/device/linear_ce_defaults.py), so loss and gradients equal CPU's bit for bit."""
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

    torch.manual_seed(0)
    x, w = torch.randn(16, 32).to(dtype), torch.randn(100, 32).to(dtype)
    target = torch.randint(0, 100, (16,))
    results = []
    for dev in ("cpu", "npu"):
        xd, wd = x.to(dev).requires_grad_(True), w.to(dev).requires_grad_(True)
        loss = torch.nn.functional.linear_cross_entropy(
            xd, wd, target.to(dev), options=LinearCrossEntropyOptions())
        results.append((loss, *torch.autograd.grad(loss, (xd, wd))))
    for cpu, npu in zip(*results):
        assert npu.device.type == "npu"
        assert torch.equal(cpu, npu.cpu())
