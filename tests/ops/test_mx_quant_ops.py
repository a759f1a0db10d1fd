"""npu_dynamic_mx_quant to float8 against a per-block loop of the OCP MX rule: X = 2^(floor(log2(amax)) - emax),
y = the float8 nearest to v / X (saturating), the scale's e8m0 code log2(X) + 127 in pairs of blocks."""
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


def test_dynamic_mx_quant_rejects_bad_arguments():
    x = torch.randn(2, 64).to(NPU)
    for kw, word in ((dict(), "dst_type 296"), (dict(dst_type=292, axis=0), "axis"),
                     (dict(dst_type=292, scale_alg=1), "scale_alg"), (dict(dst_type=292, block_size=48), "block_size"),
                     (dict(dst_type=292, round_mode="floor"), "round_mode"), (dict(dst_type=1), "dst_type must be")):
        with pytest.raises(ValueError, match=f"npu_dynamic_mx_quant: {word}"):
            torch_npu.npu_dynamic_mx_quant(x, **kw)


def test_dynamic_mx_quant_compile():
    def fn(x):
        y, s = ops.npu_dynamic_mx_quant(x, dst_type=291)
        return y.float(), s

    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(1)).to(NPU)
    eager = fn(x)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.cpu(), b.cpu())
