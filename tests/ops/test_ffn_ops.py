"""npu_ffn against a per-row loop of the documented formula activation(x W1 + b1) W2 + b2, per expert's rows
when expert_tokens groups them."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops

_ACT = {"fastgelu": lambda v: v / (1 + math.exp(-1.702 * v)),
        "gelu": lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))), "relu": lambda v: max(v, 0.0),
        "silu": lambda v: v / (1 + math.exp(-v))}


def _row(xr, w1, w2, b1, b2, act):
    h = [sum(xr[k] * w1[k][j] for k in range(len(xr))) + (0.0 if b1 is None else b1[j]) for j in range(len(w1[0]))]
    h = [_ACT[act](v) for v in h]
    return [sum(h[k] * w2[k][j] for k in range(len(h))) + (0.0 if b2 is None else b2[j]) for j in range(len(w2[0]))]


@pytest.mark.parametrize("act", sorted(_ACT))
def test_ffn_without_experts(act):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    w1, w2 = torch.randn(4, 6, generator=g, dtype=torch.float64), torch.randn(6, 4, generator=g, dtype=torch.float64)
    b1, b2 = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)
    out = torch_npu.npu_ffn(x.to(NPU), w1.to(NPU), w2.to(NPU), act, bias1=b1.to(NPU), bias2=b2.to(NPU))
    want = [_row(r, w1.tolist(), w2.tolist(), b1.tolist(), b2.tolist(), act) for r in x.reshape(-1, 4).tolist()]
    assert out.shape == x.shape
    torch.testing.assert_close(out.cpu(), torch.tensor(want, dtype=torch.float64).reshape(2, 3, 4))


def test_ffn_with_experts_and_half():
    g = torch.Generator().manual_seed(1)
    counts = [2, 0, 3]
    x = torch.randn(5, 4, generator=g).half()
    w1, w2 = torch.randn(3, 4, 8, generator=g).half(), torch.randn(3, 8, 4, generator=g).half()
    b2 = torch.randn(3, 4, generator=g).half()
    out = torch_npu.npu_ffn(x.to(NPU), w1.to(NPU), w2.to(NPU), "silu", expert_tokens=counts, bias2=b2.to(NPU),
                            inner_precise=1)
    want, row = [], 0
    for e, c in enumerate(counts):
        for _ in range(c):
            want.append(_row(x[row].float().tolist(), w1[e].float().tolist(), w2[e].float().tolist(), None,
                             b2[e].float().tolist(), "silu"))
            row += 1
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().float(), torch.tensor(want), atol=1e-2, rtol=1e-2)


def test_ffn_rejects_bad_arguments():
    x, w1, w2 = torch.randn(3, 4).to(NPU), torch.randn(4, 8).to(NPU), torch.randn(8, 4).to(NPU)
    for args, kw, word in ((("swiglu",), {}, "activation 'swiglu'"), (("tanh",), {}, "activation must be"),
                           (("relu",), dict(scale=torch.ones(1).to(NPU)), "scale"),
                           (("relu",), dict(expert_tokens_index=[1, 2]), "expert_tokens_index"),
                           (("relu",), dict(bias1=torch.ones(4).to(NPU)), "bias1")):
        with pytest.raises(ValueError, match=f"npu_ffn: {word}"):
            torch_npu.npu_ffn(x, w1, w2, *args, **kw)
    with pytest.raises(ValueError, match="npu_ffn: expert_tokens must be"):
        torch_npu.npu_ffn(x, w1.expand(2, 4, 8), w2.expand(2, 8, 4), "relu", expert_tokens=[1, 1])
    with pytest.raises(ValueError, match="npu_ffn: weight1 and weight2"):
        torch_npu.npu_ffn(x, w1, w2, "relu", expert_tokens=[1, 2])


def test_ffn_compile():
    g = torch.Generator().manual_seed(2)
    args = [torch.randn(4, 4, generator=g), torch.randn(2, 4, 6, generator=g), torch.randn(2, 6, 4, generator=g)]
    args = [t.to(NPU) for t in args]

    def fn(x, w1, w2):
        return ops.npu_ffn(x, w1, w2, "gelu", expert_tokens=[1, 3]), ops.npu_ffn(x, w1[0], w2[1], "fastgelu")

    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
