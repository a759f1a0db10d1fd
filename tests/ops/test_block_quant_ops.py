"""Block-wise dynamic int8 quantisation and grouped float8 quantisation with amax, against per-block / per-group
loops of the documented formulas; the float8 reference rounds by searching the format's whole value table."""
import math

import pytest
import torch

import torch_npu

from ._common import NPU, ops
from ._fp8 import fp8_ref


def _round_half_even(v):
    return float(round(v))  # Python's round is half to even


def _block_ref(x, min_scale, rb, cb):
    x = x.double()
    m, n = x.shape
    ys, ss = torch.zeros(m, n, dtype=torch.int64), torch.zeros(math.ceil(m / rb), math.ceil(n / cb))
    for bi in range(0, m, rb):
        for bj in range(0, n, cb):
            blk = x[bi:bi + rb, bj:bj + cb]
            s = max(blk.abs().max().item() / 127, min_scale)
            ss[bi // rb, bj // cb] = s
            for i in range(blk.shape[0]):
                for j in range(blk.shape[1]):
                    v = 0 if s == 0 else max(-128, min(127, _round_half_even(blk[i, j].item() / s)))
                    ys[bi + i, bj + j] = v
    return ys, ss


@pytest.mark.parametrize("shape,rb,cb,min_scale", [((3, 300), 1, 128, 0.0), ((5, 20), 2, 8, 0.0),
                                                    ((4, 16), 1, 128, 0.05), ((2, 3, 40), 1, 16, 0.0)])
def test_dynamic_block_quant(shape, rb, cb, min_scale):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g) * torch.rand(*shape, generator=g)).half()
    x[0, ..., :3] = 0  # part of a block at zero; the all-zero-row block below
    y, scale = torch_npu.npu_dynamic_block_quant(x.to(NPU), min_scale=min_scale, row_block_size=rb,
                                                 col_block_size=cb)
    assert y.dtype == torch.int8 and y.shape == x.shape and scale.dtype == torch.float32
    for k, xk in enumerate(x.reshape(-1, *shape[-2:])):
        ys, ss = _block_ref(xk, min_scale, rb, cb)
        got_y, got_s = (y, scale) if x.dim() == 2 else (y[k], scale[k])
        assert got_y.cpu().long().tolist() == ys.tolist()
        torch.testing.assert_close(got_s.cpu(), ss.float())


def test_dynamic_block_quant_zero_block_and_bad_arguments():
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    x[1, 200] = 3.0
    y, scale = torch_npu.npu_dynamic_block_quant(x.to(NPU))
    torch.testing.assert_close(scale.cpu(), torch.tensor([[0.0, 0.0], [0.0, 3.0 / 127]]))
    assert y.cpu()[1, 200].item() == 127
    assert int(y.cpu().abs().sum()) == 127
    for kw, word in ((dict(dst_type=2), "dst_type"), (dict(round_mode="round"), "round_mode"),
                     (dict(dst_type_max=7.0), "dst_type_max"), (dict(row_block_size=0), "row_block_size"),
                     (dict(min_scale=-1.0), "min_scale")):
        with pytest.raises(ValueError, match=f"npu_dynamic_block_quant: {word}"):
            torch_npu.npu_dynamic_block_quant(x.to(NPU), **kw)


@pytest.mark.parametrize("dst", [291, 292, torch.float8_e5m2, torch.float8_e4m3fn])
@pytest.mark.parametrize("grouped", [False, True])
def test_quant_max(dst, grouped):
    dtype = {291: torch.float8_e5m2, 292: torch.float8_e4m3fn}.get(dst, dst)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(6, 4, generator=g) * 3).bfloat16()
    x[0, 0] = 1e5  # beyond both formats' range: saturates
    ends = [2, 2, 6] if grouped else None
    scale = torch.tensor([1.5, 0.25, 40.0] if grouped else [2.0])
    y, amax = torch_npu.npu_quant_max(x.to(NPU), scale.to(NPU), dst_dtype=dst,
                                      group_list=None if ends is None else torch.tensor(ends).to(NPU))
    assert y.dtype == dtype and y.shape == x.shape and amax.dtype == x.dtype
    bounds = [0] + (ends or [6])
    want_amax = []
    for gi, (a, b) in enumerate(zip(bounds, bounds[1:])):
        rows = x[a:b].double()
        want_amax.append(rows.abs().max().item() if b > a else 0.0)
        for i in range(a, b):
            for j in range(4):
                want = fp8_ref(x[i, j].float().item() * scale[gi].item(), dtype)
                assert y.cpu()[i, j].double().item() == want, (i, j)
    assert amax.cpu().double().tolist() == want_amax


def test_quant_max_rejects_bad_arguments():
    x, s = torch.randn(4, 4).to(NPU), torch.ones(1).to(NPU)
    with pytest.raises(ValueError, match="npu_quant_max: dst_dtype hifloat8"):
        torch_npu.npu_quant_max(x, s, dst_dtype=290, round_mode="round")
    with pytest.raises(ValueError, match="npu_quant_max: round_mode"):
        torch_npu.npu_quant_max(x, s, round_mode="hybrid")
    with pytest.raises(ValueError, match="npu_quant_max: scale must be"):
        torch_npu.npu_quant_max(x, torch.ones(2).to(NPU))
    with pytest.raises(ValueError, match="npu_quant_max: group_list must be"):
        torch_npu.npu_quant_max(x, torch.ones(2).to(NPU), group_list=torch.tensor([1, 3]).to(NPU))


def test_block_quant_ops_compile():
    def fn(x, s, gl):
        y, sc = ops.npu_dynamic_block_quant(x, col_block_size=8)
        q, amax = ops.npu_quant_max(x, s, dst_dtype=292, group_list=gl)
        return y, sc, q.float(), amax

    g = torch.Generator().manual_seed(3)
    args = [torch.randn(4, 16, generator=g).half().to(NPU), torch.tensor([0.5, 2.0]).to(NPU),
            torch.tensor([1, 4]).to(NPU)]
    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
