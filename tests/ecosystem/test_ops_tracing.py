"""The npu operators trace: torch.library.opcheck (schema, fake kernel vs npu kernel, AOT dispatch with
autograd) and torch.compile(fullgraph=True) forward + backward equal eager. (opcheck's
test_autograd_registration is CPU/CUDA/XPU-only in torch 2.13, so it is not run.)"""
import pytest
import torch

UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")

NPU = torch.device("npu:0")
TRIU = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)


def _t(*shape, grad=True):
    return torch.randn(*shape, device=NPU, requires_grad=grad)


CASES = {
    "npu_fusion_attention": lambda: ((_t(2, 6, 4, 8), _t(2, 6, 2, 8), _t(2, 6, 2, 8), 4, "BSND"),
                                     dict(scale=0.3, atten_mask=TRIU.to(NPU), sparse_mode=3)),
    "npu_fusion_attention_tnd": lambda: ((_t(7, 2, 8), _t(7, 2, 8), _t(7, 2, 8), 2, "TND"),
                                         dict(scale=0.3, actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7])),
    "npu_rms_norm": lambda: ((_t(3, 8), _t(8)), dict(epsilon=1e-5)),
    "npu_rotary_mul": lambda: ((_t(2, 5, 2, 8), _t(1, 5, 1, 8), _t(1, 5, 1, 8), "interleave"), {}),
    "npu_swiglu": lambda: ((_t(3, 8),), dict(dim=-1)),
    "npu_geglu": lambda: ((_t(3, 8),), dict(dim=-1, approximate=1)),
    "npu_scaled_masked_softmax": lambda: ((_t(2, 2, 4, 4), torch.rand(2, 1, 4, 4, device=NPU) < 0.3, 0.5), {}),
    "_grouped_matmul": lambda: (([_t(6, 4)], [_t(2, 4, 3)], None, [2, 6], 3, 0, 0, None), {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_opcheck(name):
    args, kwargs = CASES[name]()
    op = getattr(torch.ops.npu, name.replace("_tnd", ""))
    torch.library.opcheck(op, args, kwargs, test_utils=UTILS)


def test_apply_adam_w_opcheck():
    p, m, v, g = (torch.rand(6, device=NPU) for _ in range(4))
    torch.library.opcheck(torch.ops.npu.npu_apply_adam_w, (0.9, 0.99, 0.01, 0.1, 0.9, 0.999, 1e-8, g, None, False,
                                                           False, p, m, v), test_utils=UTILS)


def _block(x, w_norm, cos, sin, mask):
    h = torch.ops.npu.npu_rms_norm(x, w_norm, 1e-6)[0]
    b, s, hd = h.shape
    q = torch.ops.npu.npu_rotary_mul(h.view(b, s, 2, hd // 2), cos, sin)
    o = torch.ops.npu.npu_fusion_attention(q, q, q, 2, "BSND", atten_mask=mask, sparse_mode=2, scale=0.25)[0]
    return torch.ops.npu.npu_swiglu(torch.cat([o, o * 0.5], dim=-1), dim=-1).sum()


def test_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    args = [torch.randn(2, 5, 16, device=NPU, requires_grad=True), torch.randn(16, device=NPU, requires_grad=True),
            torch.randn(1, 5, 1, 8, device=NPU), torch.randn(1, 5, 1, 8, device=NPU), TRIU.to(NPU)]
    eager = _block(*args)
    g_eager = torch.autograd.grad(eager, args[:2])
    compiled = torch.compile(_block, backend="aot_eager", fullgraph=True)
    out = compiled(*args)
    g = torch.autograd.grad(out, args[:2])
    torch.testing.assert_close(out, eager)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b)


def test_dropout_refuses_to_trace():
    q = torch.randn(1, 2, 4, 8, device=NPU)
    f = torch.compile(lambda q: torch.ops.npu.npu_fusion_attention(q, q, q, 2, "BNSD", keep_prob=0.9)[0],
                      backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="keep_prob < 1 \\(dropout\\) cannot be traced"):
        f(q)
