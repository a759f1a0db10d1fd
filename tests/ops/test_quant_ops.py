"""torch_npu's quantisation operators against per-element loops written here from its documentation's formulas
(Python floats and ints, round half to even as Python's round(), saturation by min/max)."""
import itertools

import pytest
import torch

import torch_npu

from ._common import NPU, ops


def _q(v, lo, hi):
    return max(lo, min(hi, round(v)))


def _pack_ref(vals):
    """8 int4 values per int32, element j of a group in bits 4j..4j+3, written with integer arithmetic."""
    out = []
    for i in range(0, len(vals), 8):
        word = 0
        for j, v in enumerate(vals[i:i + 8]):
            word |= (v % 16) << (4 * j)
        out.append(word - 2 ** 32 if word >= 2 ** 31 else word)
    return out


def _rows(t):
    return t.reshape(-1, t.shape[-1]).tolist()


@pytest.mark.parametrize("div_mode,dtype,axis", [(True, torch.qint8, 1), (True, torch.quint8, -1),
                                                 (True, torch.int32, 0), (False, torch.qint8, -1),
                                                 (False, torch.qint8, -2), (False, torch.quint4x2, 1)])
def test_quantize(div_mode, dtype, axis):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, generator=g) * 4
    dim = {1: 1, -1: 2, 0: 0, -2: 1}[axis] if div_mode or axis == -2 else 2
    scales = torch.rand(x.shape[dim], generator=g) + 0.2
    zero = torch.randint(-3, 4, (x.shape[dim],), generator=g)
    zero = zero.float() if not div_mode else zero.to(torch.int32)
    out = torch_npu.npu_quantize(x.to(NPU), scales.to(NPU), zero.to(NPU), dtype, axis, div_mode).cpu()
    lo, hi = {torch.qint8: (-128, 127), torch.quint8: (0, 255), torch.int32: (-2 ** 31, 2 ** 31 - 1),
              torch.quint4x2: (-8, 7)}[dtype]
    ref = torch.zeros(x.shape, dtype=torch.int64)
    for idx in itertools.product(*map(range, x.shape)):
        s, z = scales[idx[dim]].item(), zero[idx[dim]].item()
        v = x[idx].item() / s if div_mode else x[idx].item() * s
        ref[idx] = _q(v + z, lo, hi)
    if dtype == torch.quint4x2:
        assert out.dtype == torch.int32 and out.shape == (2, 3, 1)
        assert _rows(out) == [_pack_ref(r) for r in _rows(ref)]
    else:
        assert out.dtype == {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.int32: torch.int32}[dtype]
        assert out.to(torch.int64).tolist() == ref.tolist()


def test_quantize_rejects():
    x = torch.randn(2, 8, device=NPU)
    with pytest.raises(ValueError, match="npu_quantize.*dtype"):
        torch_npu.npu_quantize(x, torch.ones(8, device=NPU), None, torch.quint4x2, 1, True)
    with pytest.raises(ValueError, match="npu_quantize.*scales"):
        torch_npu.npu_quantize(x, torch.ones(3, device=NPU), None, torch.qint8, 1, True)


@pytest.mark.parametrize("packed", [False, True])
def test_anti_quant(packed):
    g = torch.Generator().manual_seed(1)
    vals = torch.randint(-8, 8, (3, 16), generator=g)
    scale, offset = torch.rand(16, generator=g), torch.randn(16, generator=g)
    x = torch.tensor([_pack_ref(r) for r in vals.tolist()], dtype=torch.int32) if packed else vals.to(torch.int8)
    out = torch_npu.npu_anti_quant(x.to(NPU), scale.to(NPU), offset=offset.to(NPU), dst_dtype=torch.bfloat16,
                                   src_dtype=torch.quint4x2 if packed else torch.int8).cpu()
    ref = [[(v + offset[j].item()) * scale[j].item() for j, v in enumerate(r)] for r in vals.tolist()]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, torch.tensor(ref).bfloat16())
    # the documented example: (x + 2) * 2 in float16
    ex = torch_npu.npu_anti_quant(torch.tensor([1, 2, 3, 4], dtype=torch.int8, device=NPU),
                                  torch.tensor([2.0], device=NPU), offset=torch.tensor([2.0], device=NPU))
    assert ex.dtype == torch.float16 and ex.cpu().tolist() == [6.0, 8.0, 10.0, 12.0]
    with pytest.raises(ValueError, match="npu_anti_quant.*scale"):
        torch_npu.npu_anti_quant(x.to(NPU), torch.ones(5, device=NPU))


def _smooth_rows(x, smooth, group_index):
    rows = _rows(x)
    if smooth is None:
        return rows
    if group_index is None:
        return [[v * s for v, s in zip(r, smooth.tolist())] for r in rows]
    out, ends = [], group_index.tolist()
    for i, r in enumerate(rows):
        grp = next(gi for gi, e in enumerate(ends) if i < e)
        out.append([v * s for v, s in zip(r, smooth[grp].tolist())])
    return out


@pytest.mark.parametrize("variant", ["plain", "smooth", "group", "int4"])
def test_dynamic_quant(variant):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    x[1, 2] = 0  # a zero row: scale 0, y 0
    smooth = group = None
    if variant == "smooth":
        smooth = torch.rand(8, generator=g, dtype=torch.float64) + 0.5
    if variant == "group":
        smooth, group = torch.rand(2, 8, generator=g, dtype=torch.float64) + 0.5, torch.tensor([4, 6])
    dst = torch.quint4x2 if variant == "int4" else None
    y, scale = torch_npu.npu_dynamic_quant(x.to(NPU), smooth_scales=None if smooth is None else smooth.to(NPU),
                                           group_index=None if group is None else group.to(NPU).int(), dst_type=dst)
    hi = 7 if dst else 127
    ref_y, ref_s = [], []
    for r in _smooth_rows(x, smooth, group):
        s = max(abs(v) for v in r) / hi
        ref_s.append(s)
        ref_y.append([_q(v / s, -hi - 1, hi) if s else 0 for v in r])
    assert scale.dtype == torch.float32 and scale.shape == (2, 3)
    torch.testing.assert_close(scale.cpu().reshape(-1), torch.tensor(ref_s, dtype=torch.float32))
    if dst:
        assert _rows(y.cpu()) == [_pack_ref(r) for r in ref_y]
    else:
        assert y.dtype == torch.int8 and _rows(y.cpu()) == ref_y


@pytest.mark.parametrize("variant", ["plain", "smooth", "group", "int4"])
def test_dynamic_quant_asymmetric(variant):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    x[3] = 0.5
    smooth = group = None
    if variant == "smooth":
        smooth = torch.rand(8, generator=g, dtype=torch.float64) + 0.5
    if variant == "group":
        smooth, group = torch.rand(3, 8, generator=g, dtype=torch.float64) + 0.5, torch.tensor([1, 3, 4])
    dst = torch.quint4x2 if variant == "int4" else None
    y, scale, offset = torch_npu.npu_dynamic_quant_asymmetric(
        x.to(NPU), smooth_scales=None if smooth is None else smooth.to(NPU),
        group_index=None if group is None else group.to(NPU).int(), dst_type=dst)
    lo, hi = (-8, 7) if dst else (-128, 127)
    ref_y, ref_s, ref_o = [], [], []
    for r in _smooth_rows(x, smooth, group):
        s = (max(r) - min(r)) / (hi - lo)
        o = hi - max(r) / s if s else 0.0
        ref_s.append(s)
        ref_o.append(o)
        ref_y.append([_q(v / s + o, lo, hi) if s else 0 for v in r])
    torch.testing.assert_close(scale.cpu(), torch.tensor(ref_s, dtype=torch.float32))
    torch.testing.assert_close(offset.cpu(), torch.tensor(ref_o, dtype=torch.float32))
    if dst:
        assert _rows(y.cpu()) == [_pack_ref(r) for r in ref_y]
    else:
        assert _rows(y.cpu()) == ref_y
    with pytest.raises(ValueError, match="npu_dynamic_quant_asymmetric.*dst_type"):
        torch_npu.npu_dynamic_quant_asymmetric(x.to(NPU), dst_type=torch.int32)
    with pytest.raises(ValueError, match="npu_dynamic_quant_asymmetric.*quant_mode"):
        torch_npu.npu_dynamic_quant_asymmetric(x.to(NPU), quant_mode="pertensor")
    with pytest.raises(ValueError, match="npu_dynamic_quant.*dst_type_max"):
        torch_npu.npu_dynamic_quant(x.to(NPU), dst_type_max=6.0)


def _mm_ref(a, b):
    """Integer matmul of nested lists (batch dims handled by the caller)."""
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


@pytest.mark.parametrize("variant", ["int8_offset", "fp16_pertoken", "bf16_floatbias", "int4"])
def test_quant_matmul(variant):
    g = torch.Generator().manual_seed(4)
    m, k, n, batch = 3, 16, 8, 2
    a = torch.randint(-8, 8, (m, k), generator=g)
    b = torch.randint(-8, 8, (batch, k, n), generator=g)
    scale, offset = torch.rand(n, generator=g) * 0.1, torch.randn(n, generator=g)
    pertoken = torch.rand(m, generator=g) + 0.5
    ibias = torch.randint(-20, 20, (batch, 1, n), generator=g, dtype=torch.int32)
    fbias = torch.randn(n, generator=g)
    kw, x1, x2 = {}, a.to(torch.int8), b.to(torch.int8)
    if variant == "int8_offset":
        kw = dict(offset=offset.to(NPU), bias=ibias.to(NPU))
    elif variant == "fp16_pertoken":
        kw = dict(pertoken_scale=pertoken.to(NPU), bias=ibias.to(NPU), output_dtype=torch.float16)
    elif variant == "bf16_floatbias":
        kw = dict(bias=fbias.to(NPU), output_dtype=torch.bfloat16)
    else:
        x1 = torch.tensor([_pack_ref(r) for r in a.tolist()], dtype=torch.int32)
        x2 = torch.stack([torch.tensor([_pack_ref(r) for r in bb.tolist()], dtype=torch.int32) for bb in b])
        kw = dict(output_dtype=torch.float16)
    out = torch_npu.npu_quant_matmul(x1.to(NPU), x2.to(NPU), scale.to(NPU), **kw).cpu()
    assert out.shape == (batch, m, n)
    ref = []
    for bi in range(batch):
        acc = _mm_ref(a.tolist(), b[bi].tolist())
        rows = []
        for i in range(m):
            row = []
            for j in range(n):
                v = acc[i][j] + (ibias[bi, 0, j].item() if "bias" in kw and kw["bias"].dtype == torch.int32 else 0)
                v *= scale[j].item()
                if variant == "fp16_pertoken":
                    v *= pertoken[i].item()
                if variant == "bf16_floatbias":
                    v += fbias[j].item()
                if variant == "int8_offset":
                    v = _q(v + offset[j].item(), -128, 127)
                row.append(v)
            rows.append(row)
        ref.append(rows)
    if variant == "int8_offset":
        assert out.dtype == torch.int8 and out.tolist() == ref
    else:
        torch.testing.assert_close(out, torch.tensor(ref).to(out.dtype))
    with pytest.raises(ValueError, match="npu_quant_matmul.*scale"):
        torch_npu.npu_quant_matmul(x1.to(NPU), x2.to(NPU), torch.ones(n, dtype=torch.int64, device=NPU))
    with pytest.raises(ValueError, match="npu_quant_matmul.*output_dtype"):
        torch_npu.npu_quant_matmul(x1.to(NPU), x2.to(NPU), scale.to(NPU), output_dtype=torch.int32)
    with pytest.raises(ValueError, match="npu_quant_matmul.*group_sizes"):
        torch_npu.npu_quant_matmul(x1.to(NPU), x2.to(NPU), scale.to(NPU), group_sizes=[1, 1, 1])


@pytest.mark.parametrize("mode", ["tensor", "channel", "group", "int4"])
def test_weight_quant_batchmatmul(mode):
    g = torch.Generator().manual_seed(5)
    m, k, n, gs = 2, 64, 8, 32
    x = torch.randn(m, k, generator=g, dtype=torch.float64)
    w = torch.randint(-8, 8, (k, n), generator=g)
    shape = {"tensor": (1,), "channel": (n,), "group": (k // gs, n), "int4": (1, n)}[mode]
    sc, off = torch.rand(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64)
    bias = torch.randn(n, generator=g, dtype=torch.float64)
    weight = torch.tensor([_pack_ref(r) for r in w.tolist()], dtype=torch.int32) if mode == "int4" else w.to(torch.int8)
    out = torch_npu.npu_weight_quant_batchmatmul(x.to(NPU), weight.to(NPU), sc.to(NPU), off.to(NPU), bias=bias.to(NPU),
                                                 antiquant_group_size=gs if mode == "group" else 0).cpu()

    def param(t, kk, j):
        if mode == "tensor":
            return t[0].item()
        if mode == "group":
            return t[kk // gs, j].item()
        return t.reshape(-1)[j].item()

    ref = [[sum(x[i, kk].item() * (w[kk, j].item() + param(off, kk, j)) * param(sc, kk, j) for kk in range(k))
            + bias[j].item() for j in range(n)] for i in range(m)]
    torch.testing.assert_close(out, torch.tensor(ref, dtype=torch.float64))
    with pytest.raises(ValueError, match="npu_weight_quant_batchmatmul.*quant_scale"):
        torch_npu.npu_weight_quant_batchmatmul(x.to(NPU), weight.to(NPU), sc.to(NPU), quant_scale=sc.float().to(NPU))


def test_quant_ops_compile():
    def fn(x, w, s):
        y, scale = ops.npu_dynamic_quant(x)
        q = ops.npu_quantize(x, s, None, torch.qint8, -1, False)
        back = ops.npu_anti_quant(q, s, dst_dtype=torch.float16)
        mm = ops.npu_quant_matmul(y, w, s, output_dtype=torch.float16)
        return y, scale, back, mm

    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 8, generator=g).to(NPU)
    w = torch.randint(-8, 8, (8, 8), generator=g, dtype=torch.int8).to(NPU)
    s = (torch.rand(8, generator=g) + 0.5).to(NPU)
    eager = fn(x, w, s)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(x, w, s)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
