"""Norm and activation operators against reference math written here from torch_npu's documentation."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, leaf as _leaf, ops, ref_leaf as _ref_leaf  # noqa: F401


def _check(out_npu, out_ref, ins_npu, ins_ref, seed=0, **tol):
    torch.testing.assert_close(out_npu.detach().cpu(), out_ref.detach(), **tol)
    g = torch.randn(out_ref.shape, dtype=out_ref.dtype, generator=torch.Generator().manual_seed(seed))
    gn = torch.autograd.grad(out_npu, ins_npu, g.to(NPU), retain_graph=True)
    gr = torch.autograd.grad(out_ref, ins_ref, g, retain_graph=True)
    for a, b in zip(gn, gr):
        torch.testing.assert_close(a.cpu(), b, **tol)


def _rstd(x, k, eps):
    return 1 / torch.sqrt(x.pow(2).mean(tuple(range(x.dim() - k, x.dim())), keepdim=True) + eps)


# ---- norms --------------------------------------------------------------------------------------------------
def test_rms_norm_backward_is_the_gradient_of_rms_norm():
    x, g, dy = torch.randn(3, 8), torch.randn(8), torch.randn(3, 8)
    xr, gr = _ref_leaf(x), _ref_leaf(g)
    rstd = _rstd(xr, 1, 1e-6)
    dx, dg = torch.autograd.grad(xr * rstd * gr, (xr, gr), dy)
    dxn, dgn = torch_npu.npu_rms_norm_backward(dy.to(NPU), x.to(NPU), g.to(NPU), rstd.detach().to(NPU))
    torch.testing.assert_close(dxn.cpu(), dx)
    torch.testing.assert_close(dgn.cpu(), dg)


def test_add_rms_norm():
    x1, x2, g = torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(8)
    n1, n2, ng = _leaf(x1), _leaf(x2), _leaf(g)
    r1, r2, rg = _ref_leaf(x1), _ref_leaf(x2), _ref_leaf(g)
    y, rstd, x = ops.npu_add_rms_norm(n1, n2, ng, 1e-5)
    xs = r1 + r2
    rstd_ref = _rstd(xs, 1, 1e-5)
    torch.testing.assert_close(rstd.cpu(), rstd_ref.detach())
    # both outputs carry gradient: the norm and the residual sum
    _check(y * 2 + x, (xs * rstd_ref * rg) * 2 + xs, (n1, n2, ng), (r1, r2, rg))


def test_add_rms_norm_cast_returns_the_float32_cast_too():
    x1, x2, g = (torch.randn(*s).half() for s in ((4, 8), (4, 8), (8,)))
    y32, y, rstd, x = ops.npu_add_rms_norm_cast(x1.to(NPU), x2.to(NPU), g.to(NPU), 1e-6)
    xs = (x1 + x2).float()
    ref = (xs * _rstd(xs, 1, 1e-6) * g.float()).half()
    torch.testing.assert_close(y.cpu(), ref)
    assert y32.dtype == torch.float32 and rstd.dtype == torch.float32
    torch.testing.assert_close(y32.cpu(), ref.float())
    torch.testing.assert_close(x.cpu(), x1 + x2)


@pytest.mark.parametrize("gamma_dims", [1, 2])
def test_gemma_rms_norm_scales_by_one_plus_gamma(gamma_dims):
    x, g = torch.randn(3, 4, 6), torch.randn(*(4, 6)[2 - gamma_dims:])
    xn, gn, xr, gr = _leaf(x), _leaf(g), _ref_leaf(x), _ref_leaf(g)
    y, rstd = torch_npu.npu_gemma_rms_norm(xn, gn, 1e-6)
    ref_rstd = _rstd(xr, gamma_dims, 1e-6)
    assert rstd.shape == ref_rstd.shape and rstd.dtype == x.dtype
    _check(y, xr * ref_rstd * (1 + gr), (xn, gn), (xr, gr))


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_eval(affine):
    x, w, b = torch.randn(5, 2, 6), torch.randn(2, 6), torch.randn(2, 6)
    out = torch_npu.npu_layer_norm_eval(x.to(NPU), [2, 6], w.to(NPU) if affine else None,
                                        b.to(NPU) if affine else None, 1e-5)
    mu = x.mean((1, 2), keepdim=True)
    var = x.var((1, 2), unbiased=False, keepdim=True)
    ref = (x - mu) / torch.sqrt(var + 1e-5)
    torch.testing.assert_close(out.cpu(), ref * w + b if affine else ref)
    with pytest.raises(ValueError, match="normalized_shape"):
        torch_npu.npu_layer_norm_eval(x.to(NPU), [5, 6])


# ---- activations --------------------------------------------------------------------------------------------
ELEMENTWISE = {
    "npu_fast_gelu": lambda x: x / (1 + torch.exp(-1.702 * x)),
    "npu_silu": lambda x: x * torch.sigmoid(x),
    "npu_mish": lambda x: x * torch.tanh(torch.log1p(torch.exp(x))),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_activations_float64(name):
    x = torch.randn(4, 7, dtype=torch.float64) * 3
    xn, xr = _leaf(x), _ref_leaf(x)
    _check(getattr(torch_npu, name)(xn), ELEMENTWISE[name](xr), (xn,), (xr,))


def test_elementwise_activations_bf16_compute_in_float32():
    x = torch.randn(16, dtype=torch.bfloat16)
    for name, ref in ELEMENTWISE.items():
        torch.testing.assert_close(getattr(ops, name)(x.to(NPU)).cpu(), ref(x.float()).to(torch.bfloat16))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_mul(approximate):
    x = torch.randn(3, 2, 10, dtype=torch.float64)
    xn, xr = _leaf(x), _ref_leaf(x)
    x1, x2 = xr[..., :5], xr[..., 5:]
    if approximate == "tanh":
        gelu = 0.5 * x1 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x1 + 0.044715 * x1 ** 3)))
    else:
        gelu = 0.5 * x1 * (1 + torch.erf(x1 / math.sqrt(2)))
    _check(torch_npu.npu_gelu_mul(xn, approximate=approximate), gelu * x2, (xn,), (xr,))
    with pytest.raises(ValueError, match="approximate"):
        torch_npu.npu_gelu_mul(xn, approximate="erf")


@pytest.mark.parametrize("interleaved,dim,grouped", [(True, -1, False), (False, -1, True), (True, 1, False),
                                                     (False, 1, True)])
def test_clipped_swiglu(interleaved, dim, grouped):
    torch.manual_seed(7)
    x = torch.randn(4, 6, 4, dtype=torch.float64) * 5  # values beyond the limit on both sides
    xn, xr = _leaf(x), _ref_leaf(x)
    alpha, limit, bias = 1.5, 4.0, 0.5
    group_index = torch.tensor([1, 2]) if grouped else None  # 3 of the pre-rows are computed
    out = ops.npu_clipped_swiglu(xn, group_index=None if group_index is None else group_index.to(NPU), dim=dim,
                                 alpha=alpha, limit=limit, bias=bias, interleaved=interleaved)
    d = dim % 3
    pre = math.prod(x.shape[:d])
    flat = xr.reshape(pre, -1)
    rows = 3 if grouped else pre
    a, b = (flat[:rows, 0::2], flat[:rows, 1::2]) if interleaved else flat[:rows].chunk(2, 1)
    a, b = a.clamp(max=limit), b.clamp(-limit, limit)
    y = a * torch.sigmoid(alpha * a) * (b + bias)
    y = torch.cat([y, torch.zeros(pre - rows, y.shape[1], dtype=y.dtype)])
    shape = list(x.shape)
    shape[d] //= 2
    _check(out, y.reshape(shape), (xn,), (xr,))


def test_norms_and_activations_compile_in_one_graph():
    x, g, r = torch.randn(2, 3, 8), torch.randn(8), torch.randn(2, 3, 8)

    def block(x, g, r):
        y, _, res = ops.npu_add_rms_norm(x, r, g, 1e-6)
        y = ops.npu_gemma_rms_norm(y, g)[0]
        h = ops.npu_gelu_mul(ops.npu_fast_gelu(y), approximate="tanh") + ops.npu_silu(y)[..., :4]
        h = ops.npu_clipped_swiglu(ops.npu_mish(h.repeat(1, 1, 2)), interleaved=False)
        return h.sum() + res.sum()

    grads = []
    for fn in (block, torch.compile(block, backend="aot_eager", fullgraph=True)):
        ins = [_leaf(t) for t in (x, g, r)]
        fn(*ins).backward()
        grads.append([t.grad.cpu() for t in ins])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
