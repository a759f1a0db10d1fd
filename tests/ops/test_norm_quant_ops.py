"""torch_npu's add + RMS norm + quantisation operators against per-row loops of the documented pieces (the add, the
RMS norm, and the static / per-token dynamic quantisation formulas), in Python floats."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops


def _q(v, lo=-128, hi=127):
    return max(lo, min(hi, round(v)))


def _norm_rows(x1, x2, gamma, beta, eps):
    rows = []
    for a, b in zip(x1.reshape(-1, x1.shape[-1]).tolist(), x2.reshape(-1, x2.shape[-1]).tolist()):
        x = [p + q for p, q in zip(a, b)]
        r = 1 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
        rows.append([v * r * g + (0.0 if beta is None else bt)
                     for v, g, bt in zip(x, gamma.tolist(), [0.0] * len(x) if beta is None else beta.tolist())])
    return rows


@pytest.mark.parametrize("div_mode", [True, False])
def test_add_rms_norm_quant(div_mode):
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(2, 3, 8, generator=g, dtype=torch.float64), torch.randn(2, 3, 8, generator=g,
                                                                                  dtype=torch.float64)
    gamma, beta = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    s1, s2 = torch.rand(8, generator=g) * 0.05 + 0.01, torch.rand(8, generator=g) * 20 + 5
    z1, z2 = torch.randint(-5, 5, (8,), generator=g, dtype=torch.int32), torch.randint(-5, 5, (8,), generator=g,
                                                                                        dtype=torch.int32)
    y1, y2, x = torch_npu.npu_add_rms_norm_quant(x1.to(NPU), x2.to(NPU), gamma.to(NPU), s1.to(NPU), z1.to(NPU),
                                                 beta.to(NPU), s2.to(NPU), z2.to(NPU), epsilon=1e-5, div_mode=div_mode)
    rows = _norm_rows(x1, x2, gamma, beta, 1e-5)

    def quant(s, z):
        return [[_q((v / s[j].item() if div_mode else v * s[j].item()) + z[j].item()) for j, v in enumerate(r)]
                for r in rows]

    assert y1.dtype == torch.int8 and y1.shape == x1.shape
    assert y1.cpu().reshape(-1, 8).tolist() == quant(s1, z1)
    assert y2.cpu().reshape(-1, 8).tolist() == quant(s2, z2)
    torch.testing.assert_close(x.cpu(), x1 + x2)
    # without scales2 the second output is a (1,) placeholder
    y1b, y2b, _ = torch_npu.npu_add_rms_norm_quant(x1.to(NPU), x2.to(NPU), gamma.to(NPU), s1.to(NPU), None,
                                                   epsilon=1e-5, div_mode=div_mode)
    assert y2b.shape == (1,)
    rows = _norm_rows(x1, x2, gamma, None, 1e-5)
    assert y1b.cpu().reshape(-1, 8).tolist() == quant(s1, torch.zeros(8))
    with pytest.raises(ValueError, match="npu_add_rms_norm_quant: axis"):
        torch_npu.npu_add_rms_norm_quant(x1.to(NPU), x2.to(NPU), gamma.to(NPU), s1.to(NPU), None, axis=0)


@pytest.mark.parametrize("variant", ["one_path", "two_paths", "mask_second_only", "int4"])
def test_add_rms_norm_dynamic_quant(variant):
    g = torch.Generator().manual_seed(1)
    x1, x2 = torch.randn(3, 8, generator=g, dtype=torch.float64), torch.randn(3, 8, generator=g, dtype=torch.float64)
    gamma, beta = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    sm1, sm2 = torch.rand(8, generator=g, dtype=torch.float64) + 0.5, torch.rand(8, generator=g,
                                                                                   dtype=torch.float64) + 0.5
    kw = {"one_path": dict(smooth_scale1=sm1), "two_paths": dict(smooth_scale1=sm1, smooth_scale2=sm2),
          "mask_second_only": dict(output_mask=[False, True]), "int4": dict(y_dtype=torch.quint4x2)}[variant]
    kw = {k: (v.to(NPU) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    y1, y2, x, s1, s2 = torch_npu.npu_add_rms_norm_dynamic_quant(x1.to(NPU), x2.to(NPU), gamma.to(NPU),
                                                                 beta=beta.to(NPU), epsilon=1e-6, **kw)
    rows = _norm_rows(x1, x2, gamma, beta, 1e-6)
    hi = 7 if variant == "int4" else 127

    def dyn(smooth):
        ys, ss, sm = [], [], [1.0] * 8 if smooth is None else smooth.tolist()
        for r in rows:
            r = [v * s for v, s in zip(r, sm)]
            s = max(abs(v) for v in r) / hi
            ss.append(s)
            ys.append([_q(v / s, -hi - 1, hi) for v in r])
        return ys, torch.tensor(ss, dtype=torch.float32)

    torch.testing.assert_close(x.cpu(), x1 + x2)
    if variant == "mask_second_only":
        assert y1.shape == (1,) and s1.shape == (1,)
        ys, ss = dyn(None)
        assert y2.cpu().tolist() == ys
        torch.testing.assert_close(s2.cpu(), ss)
        return
    ys, ss = dyn(kw.get("smooth_scale1") if variant != "int4" else None)
    if variant == "int4":
        words = [sum((v % 16) << (4 * j) for j, v in enumerate(r)) for r in ys]  # element j in bits 4j..4j+3
        packed = [[w - 2 ** 32 if w >= 2 ** 31 else w] for w in words]
        assert y1.dtype == torch.int32 and y1.cpu().tolist() == packed
    else:
        assert y1.cpu().tolist() == ys
    torch.testing.assert_close(s1.cpu(), ss)
    if variant == "two_paths":
        ys2, ss2 = dyn(sm2)
        assert y2.cpu().tolist() == ys2
        torch.testing.assert_close(s2.cpu(), ss2)
    else:
        assert y2.shape == (1,) and s2.shape == (1,)


def test_norm_quant_compile():
    def fn(x1, x2, gamma, s):
        a = ops.npu_add_rms_norm_quant(x1, x2, gamma, s, None)
        b = ops.npu_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1=s)
        return (*a, *b)

    g = torch.Generator().manual_seed(2)
    args = [torch.randn(3, 8, generator=g).to(NPU), torch.randn(3, 8, generator=g).to(NPU),
            torch.randn(8, generator=g).to(NPU), (torch.rand(8, generator=g) + 0.1).to(NPU)]
    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
