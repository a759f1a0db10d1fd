"""SwiGLU + dynamic quantisation operators against per-row Python loops of the documented steps: dequantise
((x + bias) * weight_scale * activation_scale), swish of one half times the other (activate_left), smooth by the
row's group, then scale = max|.| / 127 (7 for int4) and round half to even."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops


def _swish(v):
    return v / (1 + math.exp(-v))


def _swiglu_row(row, left):
    n = len(row) // 2
    a, b = row[:n], row[n:]
    return [_swish(p) * q for p, q in zip(a, b)] if left else [_swish(q) * p for p, q in zip(a, b)]


def _quant_row(h, hi=127):
    s = max(abs(v) for v in h) / hi
    return [max(-hi - 1, min(hi, round(v / s))) for v in h], s


def _group_of(row, ends):
    for g, e in enumerate(ends):
        if row < e:
            return g
    return len(ends) - 1


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("groups", ["none", "cumsum_per_channel", "count_per_tensor"])
def test_swiglu_quant_dynamic(left, groups):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g, dtype=torch.float64)
    ends = [2, 2, 6]
    if groups == "none":
        smooth, gi, kw = torch.rand(8, generator=g, dtype=torch.float64) + 0.5, None, {}
    elif groups == "cumsum_per_channel":
        smooth, gi, kw = torch.rand(3, 8, generator=g, dtype=torch.float64) + 0.5, torch.tensor(ends), {}
    else:
        smooth, gi, kw = torch.rand(3, generator=g, dtype=torch.float64) + 0.5, torch.tensor([2, 0, 4]), \
            dict(group_list_type=1)
    y, scale = torch_npu.npu_swiglu_quant(x.to(NPU), smooth_scales=smooth.to(NPU),
                                          group_index=None if gi is None else gi.to(NPU), activate_left=left,
                                          quant_mode=1, **kw)
    assert y.dtype == torch.int8 and y.shape == (6, 8) and scale.shape == (6,)
    for r, row in enumerate(x.tolist()):
        h = _swiglu_row(row, left)
        grp = _group_of(r, ends)
        sm = smooth.tolist() if groups == "none" else smooth[grp].tolist()
        sm = sm if isinstance(sm, list) else [sm] * 8
        q, s = _quant_row([v * m for v, m in zip(h, sm)])
        assert y[r].cpu().tolist() == q
        assert scale[r].item() == pytest.approx(s, rel=1e-6)


def test_swiglu_quant_int4_and_refusals():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 16, generator=g)
    y, scale = torch_npu.npu_swiglu_quant(x.to(NPU), quant_mode=1, dst_type=torch.quint4x2)
    assert y.dtype == torch.int32 and y.shape == (2, 3, 1) and scale.shape == (2, 3)
    q, _ = _quant_row(_swiglu_row(x[1, 2].double().tolist(), False), hi=7)
    word = sum((v % 16) << (4 * j) for j, v in enumerate(q))
    assert y[1, 2, 0].item() == (word - 2 ** 32 if word >= 2 ** 31 else word)
    with pytest.raises(ValueError, match="npu_swiglu_quant: quant_mode 0 \\(static\\) is not supported"):
        torch_npu.npu_swiglu_quant(x.to(NPU))
    with pytest.raises(ValueError, match="npu_swiglu_quant: smooth_scales must be"):
        torch_npu.npu_swiglu_quant(x.to(NPU), quant_mode=1, smooth_scales=torch.ones(2, 8).to(NPU),
                                   group_index=torch.tensor([3, 6]).to(NPU).int()[:1])


@pytest.mark.parametrize("left", [False, True])
def test_dequant_swiglu_quant_int32_with_groups(left):
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-2000, 2000, (5, 8), generator=g, dtype=torch.int32)
    ws, act = torch.rand(2, 8, generator=g) * 0.01, torch.rand(5, generator=g) + 0.5
    qs = torch.rand(2, 4, generator=g) + 0.5
    counts = [3, 2]
    y, scale = torch_npu.npu_dequant_swiglu_quant(x.to(NPU), weight_scale=ws.to(NPU), activation_scale=act.to(NPU),
                                                  quant_scale=qs.to(NPU), group_index=torch.tensor(counts).to(NPU),
                                                  activate_left=left, quant_mode=1)
    for r in range(5):
        grp = 0 if r < 3 else 1
        deq = [x[r, c].item() * ws[grp, c].item() * act[r].item() for c in range(8)]
        q, s = _quant_row([v * m for v, m in zip(_swiglu_row(deq, left), qs[grp].tolist())])
        assert y[r].cpu().tolist() == q
        assert scale[r].item() == pytest.approx(s, rel=1e-6)


def test_dequant_swiglu_quant_bias_float_input_and_refusals():
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-100, 100, (3, 8), generator=g, dtype=torch.int32)
    ws, act, bias = torch.rand(1, 8, generator=g), torch.rand(3, generator=g), torch.randint(-9, 9, (8,),
                                                                                          generator=g).int()
    y, _ = torch_npu.npu_dequant_swiglu_quant(x.to(NPU), weight_scale=ws.to(NPU), activation_scale=act.to(NPU),
                                              bias=bias.to(NPU), quant_mode=1)
    for r in range(3):
        deq = [(x[r, c].item() + bias[c].item()) * ws[0, c].item() * act[r].item() for c in range(8)]
        assert y[r].cpu().tolist() == _quant_row(_swiglu_row(deq, False))[0]
    xf = torch.randn(3, 8, generator=g).bfloat16()
    yf, _ = torch_npu.npu_dequant_swiglu_quant(xf.to(NPU), quant_mode=1)
    for r in range(3):
        assert yf[r].cpu().tolist() == _quant_row(_swiglu_row(xf[r].double().tolist(), False))[0]
    for kw, word in ((dict(quant_mode=0), "quant_mode 0"), (dict(quant_mode=1, swiglu_mode=1), "swiglu_mode 1"),
                     (dict(quant_mode=1, weight_scale=ws.to(NPU)), "weight_scale, activation_scale and bias"),
                     (dict(quant_mode=1, round_mode=1), "round_mode")):
        with pytest.raises(ValueError, match=f"npu_dequant_swiglu_quant: {word}"):
            torch_npu.npu_dequant_swiglu_quant(xf.to(NPU), **kw)


def test_swiglu_quant_ops_compile():
    def fn(x, xi, ws, act):
        a = ops.npu_swiglu_quant(x, quant_mode=1, activate_left=True)
        b = ops.npu_dequant_swiglu_quant(xi, weight_scale=ws, activation_scale=act, quant_mode=1)
        return (*a, *b)

    g = torch.Generator().manual_seed(4)
    args = [torch.randn(4, 16, generator=g), torch.randint(-50, 50, (4, 16), generator=g, dtype=torch.int32),
            torch.rand(1, 16, generator=g), torch.rand(4, generator=g)]
    args = [t.to(NPU) for t in args]
    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
