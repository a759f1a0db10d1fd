"""Quantised matmuls with a fused epilogue against Python-integer loops of the documented formulas: the exact
integer product, the scales, the bias, then gelu (math.erf / the tanh form) or the sum over the batch."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops


def _int_matmul(a, b):
    a, b = a.tolist(), b.tolist()
    return [[sum(a[i][t] * b[t][j] for t in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def _gelu(v, approximate):
    if approximate == "gelu_erf":
        return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


def _pack(q):  # int values in [-8, 7], last dim / 8 int32 words, element j of a word in bits 4j..4j+3
    words = []
    for row in q.tolist():
        out = []
        for i in range(0, len(row), 8):
            w = sum((v & 0xF) << (4 * j) for j, v in enumerate(row[i:i + 8]))
            out.append(w - 2 ** 32 if w >= 2 ** 31 else w)
        words.append(out)
    return torch.tensor(words, dtype=torch.int32)


@pytest.mark.parametrize("approximate", ["gelu_erf", "gelu_tanh"])
@pytest.mark.parametrize("variant", ["a8w8_int_bias", "a8w8_float_bias_bf16", "a4w4_per_tensor"])
def test_quant_matmul_gelu(approximate, variant):
    g = torch.Generator().manual_seed(0)
    m, k, n = 3, 16, 8
    lo, hi = (-8, 8) if variant == "a4w4_per_tensor" else (-128, 128)
    a, b = torch.randint(lo, hi, (m, k), generator=g), torch.randint(lo, hi, (k, n), generator=g)
    s1 = torch.rand(m, generator=g) * 0.01
    s2 = torch.rand(1 if variant == "a4w4_per_tensor" else n, generator=g) * 0.01
    if variant == "a8w8_float_bias_bf16":
        s2 = s2.bfloat16()
    bias = {"a8w8_int_bias": torch.randint(-500, 500, (n,), generator=g, dtype=torch.int32),
            "a8w8_float_bias_bf16": torch.randn(n, generator=g), "a4w4_per_tensor": None}[variant]
    if variant == "a4w4_per_tensor":
        x1, x2 = _pack(a), _pack(b)
    else:
        x1, x2 = a.to(torch.int8), b.to(torch.int8)
    out = torch_npu.npu_quant_matmul_gelu(x1.to(NPU), x2.to(NPU), s1.to(NPU), s2.to(NPU),
                                          bias=None if bias is None else bias.to(NPU), approximate=approximate)
    prod = _int_matmul(a, b)
    want = []
    for i in range(m):
        row = []
        for j in range(n):
            v = prod[i][j] + (bias[j].item() if variant == "a8w8_int_bias" else 0)
            v = v * s1[i].item() * s2[j if s2.numel() > 1 else 0].double().item()
            if variant == "a8w8_float_bias_bf16":
                v += bias[j].item()
            row.append(_gelu(v, approximate))
        want.append(row)
    dtype = torch.bfloat16 if variant == "a8w8_float_bias_bf16" else torch.float16
    assert out.dtype == dtype and out.shape == (m, n)
    torch.testing.assert_close(out.cpu(), torch.tensor(want, dtype=torch.float64).to(dtype))


def test_quant_matmul_gelu_broadcasts_batches_and_rejects_bad_arguments():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(-128, 128, (2, 3, 8), generator=g), torch.randint(-128, 128, (8, 4), generator=g)
    s1, s2 = torch.rand(3, generator=g) * 0.01, torch.rand(4, generator=g) * 0.01
    out = torch_npu.npu_quant_matmul_gelu(a.to(torch.int8).to(NPU), b.to(torch.int8).to(NPU), s1.to(NPU), s2.to(NPU))
    for i in range(2):
        prod = _int_matmul(a[i], b)
        want = [[_gelu(prod[r][c] * s1[r].item() * s2[c].item(), "gelu_erf") for c in range(4)] for r in range(3)]
        torch.testing.assert_close(out[i].cpu(), torch.tensor(want).half())
    x = a[0].to(torch.int8).to(NPU)
    with pytest.raises(ValueError, match="npu_quant_matmul_gelu: approximate"):
        torch_npu.npu_quant_matmul_gelu(x, b.to(torch.int8).to(NPU), s1.to(NPU), s2.to(NPU), approximate="erf")
    with pytest.raises(ValueError, match="npu_quant_matmul_gelu: x2_scale"):
        torch_npu.npu_quant_matmul_gelu(x, b.to(torch.int8).to(NPU), s1.to(NPU), s2.half().to(NPU))
    with pytest.raises(ValueError, match="npu_quant_matmul_gelu: x1 and x2"):
        torch_npu.npu_quant_matmul_gelu(x, b.to(NPU), s1.to(NPU), s2.to(NPU))


def test_quant_matmul_reduce_sum():
    g = torch.Generator().manual_seed(2)
    bsz, m, k, n = 3, 4, 8, 5
    a, b = torch.randint(-128, 128, (bsz, m, k), generator=g), torch.randint(-128, 128, (bsz, k, n), generator=g)
    s1, s2 = torch.rand(bsz, m, generator=g) * 0.01, (torch.rand(n, generator=g) * 0.01).bfloat16()
    out = torch_npu.npu_quant_matmul_reduce_sum(a.to(torch.int8).to(NPU), b.to(torch.int8).to(NPU),
                                                x1_scale=s1.to(NPU), x2_scale=s2.to(NPU))
    want = [[0.0] * n for _ in range(m)]
    for i in range(bsz):
        prod = _int_matmul(a[i], b[i])
        for r in range(m):
            for c in range(n):
                want[r][c] += prod[r][c] * s1[i, r].item() * s2[c].double().item()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), torch.tensor(want, dtype=torch.float64).bfloat16())
    with pytest.raises(ValueError, match="npu_quant_matmul_reduce_sum: x1_scale and x2_scale are required"):
        torch_npu.npu_quant_matmul_reduce_sum(a.to(torch.int8).to(NPU), b.to(torch.int8).to(NPU))
    with pytest.raises(ValueError, match="npu_quant_matmul_reduce_sum: x2_scale must be"):
        torch_npu.npu_quant_matmul_reduce_sum(a.to(torch.int8).to(NPU), b.to(torch.int8).to(NPU),
                                              x1_scale=s1.to(NPU), x2_scale=s2[:2].to(NPU))


def test_quant_matmul_ops_compile():
    def fn(x1, x2, s1, s2, xb1, xb2, sb1, sb2):
        return (ops.npu_quant_matmul_gelu(x1, x2, s1, s2, approximate="gelu_tanh"),
                ops.npu_quant_matmul_reduce_sum(xb1, xb2, x1_scale=sb1, x2_scale=sb2))

    g = torch.Generator().manual_seed(3)
    args = [torch.randint(-128, 128, (3, 8), generator=g).to(torch.int8), torch.randint(-128, 128, (8, 4),
                                                                                          generator=g).to(torch.int8),
            torch.rand(3, generator=g) * 0.01, torch.rand(4, generator=g) * 0.01,
            torch.randint(-128, 128, (2, 3, 8), generator=g).to(torch.int8),
            torch.randint(-128, 128, (2, 8, 4), generator=g).to(torch.int8),
            torch.rand(2, 3, generator=g), (torch.rand(4, generator=g) * 0.01).bfloat16()]
    args = [t.to(NPU) for t in args]
    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
