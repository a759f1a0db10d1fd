"""The MX quantisers to float8 against per-block loops of the documented rules: X = 2^(floor(log2(amax)) - emax)
(OCP) or 2^ceil(log2(amax / Amax(DType))) (cuBLAS), y = the float8 nearest to v / X (saturating), the scale's e8m0
code log2(X) + 127 in pairs of blocks (per group along dim 0 for the grouped form)."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops
from ._fp8 import fp8_ref

_EMAX = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}


@pytest.mark.parametrize("dst,dtype", [(292, torch.float8_e4m3fn), (291, torch.float8_e5m2),
                                       (torch.float8_e4m3fn, torch.float8_e4m3fn)])
@pytest.mark.parametrize("n,block", [(96, 32), (80, 32), (64, 64)])
def test_dynamic_mx_quant(dst, dtype, n, block):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, n, generator=g) * torch.logspace(-3, 3, n)).bfloat16()
    x[1, :block] = 0  # an all-zero block: code 0
    y, codes = torch_npu.npu_dynamic_mx_quant(x.to(NPU), dst_type=dst, block_size=block)
    blocks = math.ceil(n / block)
    assert y.dtype == dtype and y.shape == x.shape
    assert codes.dtype == torch.uint8 and codes.shape == (3, math.ceil(blocks / 2), 2)
    flat_codes = codes.cpu().reshape(3, -1).tolist()
    for r in range(3):
        for b in range(blocks):
            vals = x[r, b * block:(b + 1) * block].double().tolist()
            amax = max(abs(v) for v in vals)
            e = -127 if amax == 0 else max(-127, min(127, math.floor(math.log2(amax)) - _EMAX[dtype]))
            assert flat_codes[r][b] == e + 127
            for j, v in enumerate(vals):
                assert y[r, b * block + j].double().item() == fp8_ref(v / 2.0 ** e, dtype), (r, b, j)
        if blocks % 2:
            assert flat_codes[r][blocks] == 0  # the pad of an odd block count


def _exp_alg1(amax, dtype, low=0.0):
    ratio = float(torch.tensor(max(amax, low), dtype=torch.float32) / torch.finfo(dtype).max)  # float32, as documented
    return -127 if ratio == 0 else max(-127, min(127, math.ceil(math.log2(ratio))))


def test_dynamic_mx_quant_cublas_scale():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 64, generator=g).bfloat16()
    x[0, 0] = 448.0 * 2 ** -3  # an exact power-of-two ratio: ceil keeps it
    y, codes = torch_npu.npu_dynamic_mx_quant(x.to(NPU), dst_type=292, scale_alg=1, max_low_bound=0.5)
    for r in range(2):
        for b in range(2):
            vals = x[r, b * 32:(b + 1) * 32].double().tolist()
            e = _exp_alg1(max(abs(v) for v in vals), torch.float8_e4m3fn, 0.5)
            assert codes.cpu()[r, 0, b].item() == e + 127
            for j, v in enumerate(vals):
                assert y[r, b * 32 + j].double().item() == fp8_ref(v / 2.0 ** e, torch.float8_e4m3fn)
    assert codes.cpu()[0, 0, 0].item() == -3 + 127


@pytest.mark.parametrize("scale_alg", [0, 1])
def test_grouped_dynamic_mx_quant(scale_alg):
    g = torch.Generator().manual_seed(3)
    m, n = 100, 3
    x = (torch.randn(m, n, generator=g) * 5).half()
    ends = [40, 40, 100]  # group sizes 40 (2 blocks), 0, 60 (2 blocks)
    y, codes = torch_npu.npu_grouped_dynamic_mx_quant(x.to(NPU), torch.tensor(ends, dtype=torch.int32).to(NPU),
                                                      dst_type=24, scale_alg=scale_alg)
    dtype = torch.float8_e4m3fn
    assert y.dtype == dtype and codes.shape == (m // 64 + 3, n, 2)
    want_codes = torch.zeros(m // 64 + 3, n, 2, dtype=torch.int64)
    pair_row = 0
    for start, end in zip([0] + ends, ends):
        blocks = [(s, min(s + 32, end)) for s in range(start, end, 32)]
        for bi, (a, b) in enumerate(blocks):
            for c in range(n):
                vals = x[a:b, c].double().tolist()
                amax = max(abs(v) for v in vals)
                if scale_alg == 0:
                    e = -127 if amax == 0 else math.floor(math.log2(amax)) - _EMAX[dtype]
                else:
                    e = _exp_alg1(amax, dtype)
                want_codes[pair_row + bi // 2, c, bi % 2] = e + 127
                for i, v in enumerate(vals):
                    assert y[a + i, c].double().item() == fp8_ref(v / 2.0 ** e, dtype), (a + i, c)
        pair_row += (len(blocks) + 1) // 2
    assert codes.cpu().long().tolist() == want_codes.tolist()
    with pytest.raises(ValueError, match="npu_grouped_dynamic_mx_quant: group_index must be non-decreasing"):
        torch_npu.npu_grouped_dynamic_mx_quant(x.to(NPU), torch.tensor([50, 40], dtype=torch.int32).to(NPU))
    with pytest.raises(ValueError, match="npu_grouped_dynamic_mx_quant: dst_type 296"):
        torch_npu.npu_grouped_dynamic_mx_quant(x.to(NPU), torch.tensor([100], dtype=torch.int32).to(NPU),
                                               dst_type=296)


def _check_axis_blocks(x, y, codes_at, dtype, scale_alg=0):
    """x (M, N): blocks of 32 rows per column; codes_at(p, col, slot) reads the scale of block 2p + slot."""
    m, n = x.shape
    for c in range(n):
        for b in range(math.ceil(m / 32)):
            vals = x[b * 32:(b + 1) * 32, c].double().tolist()
            amax = max(abs(v) for v in vals)
            if scale_alg == 0:
                e = -127 if amax == 0 else math.floor(math.log2(amax)) - _EMAX[dtype]
            else:
                e = _exp_alg1(amax, dtype)
            assert codes_at(b // 2, c, b % 2) == e + 127
            for i, v in enumerate(vals):
                assert y[b * 32 + i, c].double().item() == fp8_ref(v / 2.0 ** e, dtype)


def test_dynamic_mx_quant_along_the_first_axis():
    x = (torch.randn(70, 3, generator=torch.Generator().manual_seed(4)) * 3).bfloat16()
    y, codes = torch_npu.npu_dynamic_mx_quant(x.to(NPU), axis=0, dst_type=292)
    assert y.shape == (70, 3) and codes.shape == (2, 3, 2)
    codes = codes.cpu()
    _check_axis_blocks(x, y.cpu(), lambda p, c, s: codes[p, c, s].item(), torch.float8_e4m3fn)


@pytest.mark.parametrize("scale_alg", [0, 1])
def test_dynamic_mx_quant_with_dual_axis(scale_alg):
    x = (torch.randn(2, 40, 70, generator=torch.Generator().manual_seed(5)) * 3).half()
    y1, s1, y2, s2 = torch_npu.npu_dynamic_mx_quant_with_dual_axis(x.to(NPU), dst_type=23, scale_alg=scale_alg)
    dtype = torch.float8_e5m2
    assert s1.shape == (2, 40, 2, 2) and s2.shape == (2, 1, 70, 2)
    y1, s1, y2, s2 = y1.cpu(), s1.cpu(), y2.cpu(), s2.cpu()
    for b in range(2):
        _check_axis_blocks(x[b].t(), y1[b].t(), lambda p, c, s: s1[b, c, p, s].item(), dtype, scale_alg)
        _check_axis_blocks(x[b], y2[b], lambda p, c, s: s2[b, p, c, s].item(), dtype, scale_alg)
    with pytest.raises(ValueError, match="npu_dynamic_mx_quant_with_dual_axis: dst_type 296"):
        torch_npu.npu_dynamic_mx_quant_with_dual_axis(x.to(NPU))


def test_dynamic_mx_quant_rejects_bad_arguments():
    x = torch.randn(2, 64).to(NPU)
    for kw, word in ((dict(), "dst_type 296"), (dict(dst_type=292, axis=2), "axis"),
                     (dict(dst_type=292, scale_alg=2), "scale_alg"),
                     (dict(dst_type=292, max_low_bound=1.0), "max_low_bound"),
                     (dict(dst_type=292, block_size=48), "block_size"),
                     (dict(dst_type=292, round_mode="floor"), "round_mode"), (dict(dst_type=1), "dst_type must be")):
        with pytest.raises(ValueError, match=f"npu_dynamic_mx_quant: {word}"):
            torch_npu.npu_dynamic_mx_quant(x, **kw)


def test_dynamic_mx_quant_compile():
    gi = torch.tensor([30, 96], dtype=torch.int32).to(NPU)

    def fn(x):
        y, s = ops.npu_dynamic_mx_quant(x, dst_type=291)
        gy, gs = ops.npu_grouped_dynamic_mx_quant(x, gi)
        return y.float(), s, gy.float(), gs

    x = torch.randn(96, 96, generator=torch.Generator().manual_seed(1)).to(NPU)
    eager = fn(x)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
