"""npu_add_quant_gmm_ against a per-group, per-element loop of the dequantised product (each float8 value times
2^(code - 127) of its 32-row block), and against the unquantised product of operands quantised with
npu_grouped_dynamic_mx_quant (the scale layout both share)."""
import pytest
import torch

import torch_npu

from ._common import NPU, ops


def _rand_codes(rows, width, gen):
    return torch.randint(120, 134, (rows, width, 2), generator=gen).to(torch.uint8)


@pytest.mark.parametrize("group_list_type", [0, 1])
def test_add_quant_gmm_against_the_dequantised_loop(group_list_type):
    gen = torch.Generator().manual_seed(0)
    k, m, n = 100, 3, 2
    x1 = (torch.randn(k, m, generator=gen) * 4).to(torch.float8_e4m3fn)
    x2 = (torch.randn(k, n, generator=gen) * 4).to(torch.float8_e5m2)
    ends, sizes = [40, 40, 90], [40, 0, 50]  # K rows 90..99 belong to no group
    c1, c2 = _rand_codes(k // 64 + 3, m, gen), _rand_codes(k // 64 + 3, n, gen)
    y0 = torch.randn(3, m, n, generator=gen)
    y = y0.to(NPU)
    gl = torch.tensor(ends if group_list_type == 0 else sizes).to(NPU)
    out = torch_npu.npu_add_quant_gmm_(y, x1.to(NPU), x2.to(NPU), c2.to(NPU), gl, x1_scale=c1.to(NPU),
                                       group_list_type=group_list_type, x1_scale_dtype=293, x2_scale_dtype=293)
    assert out is y
    want = y0.double().clone()
    pair, start = 0, 0
    for gi, end in enumerate(ends):
        blocks = -(-(end - start) // 32)
        for r in range(start, end):
            b = (r - start) // 32
            for i in range(m):
                s1 = 2.0 ** (c1[pair + b // 2, i, b % 2].item() - 127)
                for j in range(n):
                    s2 = 2.0 ** (c2[pair + b // 2, j, b % 2].item() - 127)
                    want[gi, i, j] += x1[r, i].double().item() * s1 * x2[r, j].double().item() * s2
        pair += (blocks + 1) // 2
        start = end
    torch.testing.assert_close(y.cpu(), want.float())


def test_add_quant_gmm_with_mx_quantised_operands():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(96, 4, generator=gen), torch.randn(96, 5, generator=gen)
    gi = torch.tensor([64, 96], dtype=torch.int32).to(NPU)
    x1, s1 = torch_npu.npu_grouped_dynamic_mx_quant(a.to(NPU), gi, dst_type=24)
    x2, s2 = torch_npu.npu_grouped_dynamic_mx_quant(b.to(NPU), gi, dst_type=24)
    y = torch.zeros(2, 4, 5).to(NPU)
    torch_npu.npu_add_quant_gmm_(y, x1, x2, s2.view(torch.float8_e8m0fnu), gi.long(),
                                 x1_scale=s1.view(torch.float8_e8m0fnu))
    want = torch.stack([a[:64].t() @ b[:64], a[64:].t() @ b[64:]])
    torch.testing.assert_close(y.cpu(), want, atol=0.5, rtol=0.1)  # float8 e4m3 has 3 mantissa bits


def test_add_quant_gmm_rejects_bad_arguments():
    y = torch.zeros(1, 2, 2).to(NPU)
    x = torch.zeros(32, 2).to(torch.float8_e4m3fn).to(NPU)
    codes = torch.full((1, 2, 2), 127, dtype=torch.uint8).to(NPU)
    gl = torch.tensor([32]).to(NPU)
    with pytest.raises(ValueError, match="npu_add_quant_gmm_: x2_scale: float scales"):
        torch_npu.npu_add_quant_gmm_(y, x, x, torch.ones(1, 2).to(NPU), gl, x1_scale=codes, x1_scale_dtype=293)
    with pytest.raises(ValueError, match="npu_add_quant_gmm_: x1_scale must be"):
        torch_npu.npu_add_quant_gmm_(y, x, x, codes, gl, x1_scale=codes, x2_scale_dtype=293)
    with pytest.raises(ValueError, match="npu_add_quant_gmm_: x1_dtype"):
        torch_npu.npu_add_quant_gmm_(y, x, x, codes, gl, x1_scale=codes, x1_dtype=290)
    with pytest.raises(ValueError, match="npu_add_quant_gmm_: group_list must describe"):
        torch_npu.npu_add_quant_gmm_(y, x, x, codes, torch.tensor([40]).to(NPU), x1_scale=codes,
                                     x1_scale_dtype=293, x2_scale_dtype=293)


def test_add_quant_gmm_compile():
    gen = torch.Generator().manual_seed(2)
    x1 = (torch.randn(40, 2, generator=gen)).to(torch.float8_e4m3fn).to(NPU)
    x2 = (torch.randn(40, 3, generator=gen)).to(torch.float8_e4m3fn).to(NPU)
    c1, c2 = (torch.full((2, w, 2), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu).to(NPU) for w in (2, 3))
    gl = torch.tensor([16, 40]).to(NPU)

    def fn(y):
        ops.npu_add_quant_gmm_(y, x1, x2, c2, gl, x1_scale=c1)
        return y * 1

    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        results.append(f(torch.ones(2, 2, 3).to(NPU)).cpu())
    torch.testing.assert_close(results[0], results[1])
