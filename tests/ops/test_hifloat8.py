"""HiFloat8: the codec (npudist.formats.hifloat8) against the format's definition (arXiv 2409.16626: its tables of
dot codes, exponent ranges and mantissa widths, its special values, TA rounding), and torch_npu.HiFloat8Tensor's
API (torch_npu 2.14.0's torch_npu/utils/hif8_tensor.py) on npu and cpu inputs."""
from __future__ import annotations

import io
import math
import pickle

import numpy as np
import pytest
import torch

import torch_npu
from npudist.formats import hifloat8 as hif8
from npudist.formats.hifloat8_tensor import HiFloat8Tensor

DEVICES = ("cpu", "npu")
ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def _reference_grid() -> tuple[np.ndarray, list[int]]:
    """Positive HiF8 magnitudes in float64 from the paper's definition, with their codes, smallest first.

    Written from the definition independently of the codec: (dot, exponent range, mantissa bits) per row of the
    paper's table, the sign-magnitude exponent with its implicit leading 1, and the denormals 2^(M-23).
    """
    entries = [(0.0, 0x00)]
    for m in range(1, 8):                                   # dot 0000: denormal
        entries.append((2.0 ** (m - 23), m))
    rows = [("0001", 0, 3), ("001", 1, 3), ("01", 2, 3), ("10", 3, 2), ("11", 4, 1)]
    for dot, d, mbits in rows:
        exps = [0] if d == 0 else [s * mag for s in (1, -1) for mag in range(1 << (d - 1), 1 << d)]
        for e in exps:
            # exponent field: its sign, then the magnitude without its leading 1 (d - 1 bits)
            e_field = "" if d == 0 else ("1" if e < 0 else "0") + format(abs(e), "b")[1:]
            for m in range(1 << mbits):
                bits = "0" + dot + e_field + format(m, f"0{mbits}b")
                assert len(bits) == 8, bits
                if bits != "01101111":                      # E = +15, M = 1 is the inf pattern
                    entries.append((2.0 ** e * (1 + m / 2 ** mbits), int(bits, 2)))
    entries.sort()
    values = np.array([v for v, _ in entries])
    return values, [c for _, c in entries]


def test_decoder_matches_the_papers_values():
    t = hif8.decode_table()
    expect = {
        0x00: 0.0, 0x01: 2.0 ** -22, 0x07: 2.0 ** -16,       # zero, smallest and largest denormal
        0x08: 1.0, 0x0F: 1.875,                                 # dot 0001: E = 0, 3 mantissa bits
        0x10: 2.0, 0x18: 0.5, 0x1F: 0.5 * 1.875,                # dot 001: E = +-1
        0x20: 4.0, 0x28: 8.0, 0x30: 0.25, 0x38: 0.125,          # dot 01: E = +-2, +-3
        0x40: 16.0, 0x43: 28.0, 0x5C: 2.0 ** -7,                # dot 10: E = +-4..7, 2 mantissa bits
        0x60: 256.0, 0x61: 384.0, 0x6E: 32768.0, 0x7E: 2.0 ** -15,  # dot 11: E = +-8..15, 1 mantissa bit
        0xEE: -32768.0, 0x88: -1.0,
    }
    for code, value in expect.items():
        assert t[code].item() == value, hex(code)
    assert math.isnan(t[0x80]) and t[0x6F] == math.inf and t[0xEF] == -math.inf
    assert (hif8.MAX, hif8.MIN_NORMAL, hif8.MIN_DENORMAL) == (32768.0, 2.0 ** -15, 2.0 ** -22)
    # "7 exponent values with 3-bit mantissa, 8 with 2-bit, 16 with 1-bit; 7 denormal powers of 2; 38 binades"
    finite = t[torch.isfinite(t) & (t > 0)].double()
    binade = torch.floor(torch.log2(finite)).long()
    per_binade = {int(e): int((binade == e).sum()) for e in binade.unique()}
    assert sorted(e for e, n in per_binade.items() if n == 8) == list(range(-3, 4))
    assert sorted(e for e, n in per_binade.items() if n == 4) == [-7, -6, -5, -4, 4, 5, 6, 7]
    # 2^15's binade holds only 2^15 (1.5 * 2^15 is the inf pattern)
    assert sorted(e for e, n in per_binade.items() if n == 2) == list(range(-15, -7)) + list(range(8, 15))
    assert sorted(e for e, n in per_binade.items() if n == 1) == list(range(-22, -15)) + [15]
    assert len(per_binade) == 38


def test_decoder_agrees_with_an_independent_reading_of_the_definition():
    values, codes = _reference_grid()
    t = hif8.decode_table()
    assert len(codes) == len(set(codes)) == 127
    for v, c in zip(values, codes):
        assert t[c].item() == v and (c == 0 or t[c | 0x80].item() == -v), hex(c)


@pytest.mark.parametrize("device", DEVICES)
def test_every_code_round_trips(device):
    codes = ALL_CODES.to(device)
    values = hif8.from_hifloat8(codes)
    assert values.device.type == device
    assert torch.equal(hif8.to_hifloat8(values).cpu(), ALL_CODES)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):   # every value is exact in these
        assert torch.equal(hif8.to_hifloat8(hif8.from_hifloat8(codes, dtype)).cpu(), ALL_CODES)


def _nearest_reference(x: np.ndarray) -> np.ndarray:
    """Round to the nearest of the grid (with the inf pattern standing at 1.5 * 2^15), ties away from zero."""
    values, codes = _reference_grid()
    grid = np.append(values, 1.5 * 2 ** 15)
    grid_codes = np.array(codes + [0x6F])
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(grid, a, side="left"), 1, len(grid) - 1)
    lo = hi - 1
    pick_hi = (a - grid[lo]) >= (grid[hi] - a)           # a tie goes to the larger magnitude
    out = np.where(pick_hi, grid_codes[hi], grid_codes[lo])
    out = np.where(a >= grid[-1], 0x6F, out)
    out = np.where((x < 0) & (out != 0), out | 0x80, out)
    return out.astype(np.uint8)


@pytest.mark.parametrize("device", DEVICES)
def test_random_values_round_to_nearest_ties_away(device):
    g = torch.Generator().manual_seed(0)
    mag = torch.exp2(torch.empty(200_000).uniform_(-26.0, 17.0, generator=g))
    x = (mag * torch.where(torch.rand(200_000, generator=g) < 0.5, -1.0, 1.0)).float()
    got = hif8.to_hifloat8(x.to(device)).cpu().numpy()
    np.testing.assert_array_equal(got, _nearest_reference(x.numpy()))
    xb = x.bfloat16()                                      # read through its int16 bits
    np.testing.assert_array_equal(hif8.to_hifloat8(xb.to(device)).cpu().numpy(),
                                  _nearest_reference(xb.float().numpy()))


@pytest.mark.parametrize("device", DEVICES)
def test_midpoints_round_away_from_zero(device):
    values, codes = _reference_grid()
    grid = np.append(values, 1.5 * 2 ** 15)
    grid_codes = codes + [0x6F]
    mids = torch.tensor((grid[:-1] + grid[1:]) / 2, dtype=torch.float32)
    assert torch.equal(mids.double(), torch.tensor((grid[:-1] + grid[1:]) / 2))   # every midpoint is exact
    below = torch.nextafter(mids, torch.zeros_like(mids))
    for sign, flag in ((1.0, 0), (-1.0, 0x80)):
        up = hif8.to_hifloat8((sign * mids).to(device)).cpu().tolist()
        down = hif8.to_hifloat8((sign * below).to(device)).cpu().tolist()
        assert up == [c | flag for c in grid_codes[1:]]
        assert down == [c | flag if c else 0 for c in grid_codes[:-1]]


@pytest.mark.parametrize("device", DEVICES)
def test_overflow_specials_and_underflow(device):
    def enc(vals, **kw):
        return hif8.to_hifloat8(torch.tensor(vals, dtype=torch.float32, device=device), **kw).cpu().tolist()

    tiny = 2.0 ** -23
    vals = [32768.0, 40959.996, 40960.0, 49152.0, 1e30, -1e30, math.inf, -math.inf, math.nan, -0.0, -1e-30,
            tiny, -tiny, float(np.nextafter(np.float32(tiny), np.float32(0))), 1e-40]
    assert enc(vals) == [0x6E, 0x6E, 0x6F, 0x6F, 0x6F, 0xEF, 0x6F, 0xEF, 0x80, 0x00, 0x00, 0x01, 0x81, 0x00, 0x00]
    assert enc(vals, saturate=True)[:8] == [0x6E, 0x6E, 0x6E, 0x6E, 0x6E, 0xEE, 0x6F, 0xEF]
    nan_payloads = torch.tensor([0x7F800001, 0x7FC00000, -1], dtype=torch.int32).view(torch.float32)
    assert hif8.to_hifloat8(nan_payloads.to(device)).cpu().tolist() == [0x80] * 3   # NaN's low bits decide
    h = enc([1.0, 1.0625, 1.0625000001, 1.1875, -1.0625, 24.0, 20.0, 22.0])
    assert h == [0x08, 0x09, 0x09, 0x0A, 0x89, 0x42, 0x41, 0x42]     # ties (1.0625, 1.1875, 22) go away from 0


def test_half_precision_inputs_encode_as_their_float32_values():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 100
    for dtype in (torch.float16, torch.bfloat16):
        xd = x.to(dtype)
        assert torch.equal(hif8.to_hifloat8(xd), hif8.to_hifloat8(xd.float()))


def test_codec_rejects_wrong_inputs():
    with pytest.raises(ValueError, match="uint8"):
        hif8.from_hifloat8(torch.zeros(3))
    with pytest.raises(ValueError, match="floating dtype"):
        hif8.from_hifloat8(ALL_CODES, torch.int32)
    with pytest.raises(ValueError, match="tensor"):
        hif8.to_hifloat8([1.0])
    with pytest.raises(ValueError, match="real"):
        hif8.to_hifloat8(torch.zeros(2, dtype=torch.complex64))


# torch_npu.HiFloat8Tensor

def test_exported_as_torch_npu_hifloat8tensor():
    assert torch_npu.HiFloat8Tensor is HiFloat8Tensor


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_to_and_from_hifloat8(device, dtype):
    x = (torch.randn(5, 7, generator=torch.Generator().manual_seed(2)) * 10).to(dtype).to(device)
    h = HiFloat8Tensor.to_hifloat8(x)
    assert isinstance(h, HiFloat8Tensor) and h.dtype == dtype and h.shape == x.shape
    assert h.device.type == "npu" and h._data.dtype == torch.uint8        # codes live on the npu, as upstream
    assert torch.equal(h._data.cpu(), hif8.to_hifloat8(x.cpu().float()))
    decoded = hif8.from_hifloat8(h._data.cpu())
    assert torch.equal(h.from_hifloat8().cpu(), decoded.to(dtype))
    assert h.float().dtype == torch.float32 and torch.equal(h.float().cpu(), decoded)
    assert h.half().dtype == torch.float16 and torch.equal(h.half().cpu(), decoded.half())
    assert h.bfloat16().dtype == torch.bfloat16 and torch.equal(h.bfloat16().cpu(), decoded.bfloat16())
    assert h.cpu().device.type == "cpu" and torch.equal(h.cpu(), decoded.to(dtype))
    assert "HiFloat8Tensor(data=" in repr(h)


def test_integer_input_gets_float32_nominal_dtype():
    h = HiFloat8Tensor.to_hifloat8(torch.tensor([1, 3, 17, 1000]))
    assert h.dtype == torch.float32 and h.float().cpu().tolist() == [1.0, 3.0, 16.0, 1024.0]


def test_views_keep_the_codes():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3)).npu()
    h = HiFloat8Tensor.to_hifloat8(x)
    codes = h._data
    cases = {
        "view": (h.view(6, 4), codes.view(6, 4)), "view_tuple": (h.view((3, 8)), codes.view(3, 8)),
        "reshape": (h.reshape(2, 12), codes.reshape(2, 12)), "transpose": (h.transpose(0, 1), codes.t()),
        "slice": (h[1:3], codes[1:3]), "detach": (h.detach(), codes), "clone": (h.clone(), codes),
        "contiguous": (h.transpose(0, 1).contiguous(), codes.t().contiguous()),
        "to_dtype": (h.to_dtype(torch.bfloat16), codes),
    }
    for name, (got, want) in cases.items():
        assert isinstance(got, HiFloat8Tensor), name
        assert got.shape == want.shape and torch.equal(got._data, want), name
    assert h.contiguous() is h
    assert cases["clone"][0]._data.data_ptr() != codes.data_ptr()
    assert cases["transpose"][0]._data.data_ptr() == codes.data_ptr()
    assert cases["to_dtype"][0].dtype == torch.bfloat16
    assert torch.equal(h.transpose(0, 1).contiguous().float(), h.float().t())


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_is_straight_through(device):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4)).to(device).requires_grad_()
    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(5)).npu()
    y = HiFloat8Tensor.to_hifloat8(x).from_hifloat8()
    (y * w).sum().backward()
    assert x.grad.device.type == device and torch.equal(x.grad.cpu(), w.cpu())   # d/dx is the incoming gradient

    x.grad = None
    h = HiFloat8Tensor.to_hifloat8(x)
    z = h.transpose(0, 1).contiguous().view(2, 6).reshape(12).clone().float()
    (z * torch.arange(12.0, device="npu")).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.arange(12.0).view(2, 6).reshape(4, 3).t())


def test_autograd_to_half_gradient_keeps_input_dtype():
    x = torch.randn(8, generator=torch.Generator().manual_seed(6)).npu().requires_grad_()
    y = HiFloat8Tensor.to_hifloat8(x).from_hifloat8(torch.bfloat16)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and torch.equal(x.grad.cpu(), torch.ones(8))


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_of_hifloat8_tensors_is_matmul_of_decoded_values(device):
    g = torch.Generator().manual_seed(7)
    a = HiFloat8Tensor.to_hifloat8((torch.randn(16, 32, generator=g) * 3).to(device))
    b = HiFloat8Tensor.to_hifloat8((torch.randn(32, 8, generator=g) * 3).to(device))
    out = torch.matmul(a, b)
    assert type(out) is torch.Tensor and out.dtype == torch.float32
    ref = torch.matmul(hif8.from_hifloat8(a._data.cpu()), hif8.from_hifloat8(b._data.cpu()))
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-6, atol=1e-5)
    assert torch.equal((a @ b).cpu(), (a.float() @ b.float()).cpu())
    assert torch.equal(torch.nn.functional.linear(a, b.transpose(0, 1)).cpu(), (a.float() @ b.float()).cpu())
    # a HiFloat8Tensor leaf (a weight) gets the gradient of the matmul on its decoded values
    a.requires_grad_()
    w = torch.randn(32, 4, generator=g).npu().requires_grad_()           # the codes live on the npu
    g_out = torch.randn(16, 4, generator=g).npu()
    (torch.matmul(a, w) * g_out).sum().backward()
    assert torch.equal(a.grad, g_out @ w.detach().t())
    assert torch.equal(w.grad.cpu(), (a.float().detach().t() @ g_out).cpu())


def test_in_place_operators_and_copies_encode_back():
    x = torch.tensor([1.0, 2.0, 3.0, -5.0]).npu()
    h = HiFloat8Tensor.to_hifloat8(x)
    ret = h.add_(torch.tensor([0.0625, 0.1, 10.0, 0.0]).npu())
    assert ret is h
    assert torch.equal(h._data.cpu(), hif8.to_hifloat8(torch.tensor([1.0625, 2.1, 13.0, -5.0])))
    assert h.float().cpu().tolist() == [1.125, 2.0, 13.0, -5.0]      # 1.0625 ties away; 2.1 rounds to 2.0
    h.copy_(torch.tensor([0.3, 50000.0, -1e-30, 7.0]))              # float into codes (cpu source)
    assert h._data.cpu().tolist() == hif8.to_hifloat8(torch.tensor([0.3, 50000.0, -1e-30, 7.0])).tolist()
    dst = torch.empty(4, device="npu")
    dst.copy_(h)
    assert torch.equal(dst, h.float())
    other = HiFloat8Tensor.to_hifloat8(torch.tensor([4.0, 4.0, 4.0, 4.0]))
    h.copy_(other)
    assert torch.equal(h._data, other._data)
    h.data = torch.tensor([1.0, 0.1, 1000.0, -2.0])
    assert h.float().cpu().tolist() == [1.0, 0.09375, 1024.0, -2.0]  # 0.1 = 1.6 * 2^-4: 2 bits, 1.5 * 2^-4
    out = torch.empty(4, device="npu")
    torch.mul(h, 2.0, out=out)
    assert torch.equal(out, h.float() * 2)


def test_pickle_and_torch_save():
    h = HiFloat8Tensor.to_hifloat8(torch.randn(3, 5).npu()).to_dtype(torch.bfloat16)
    p = pickle.loads(pickle.dumps(h))
    buf = io.BytesIO()
    torch.save(h, buf)
    buf.seek(0)
    s = torch.load(buf, weights_only=False)
    for got in (p, s):
        assert isinstance(got, HiFloat8Tensor) and got.dtype == torch.bfloat16 and got.device.type == "npu"
        assert torch.equal(got._data, h._data)


def test_constructor_checks():
    codes = hif8.to_hifloat8(torch.randn(4))
    h = HiFloat8Tensor(data=codes)                      # a cpu buffer is moved to the npu
    assert h.device.type == "npu" and h.dtype == torch.float32 and torch.equal(h._data.cpu(), codes)
    with pytest.raises(ValueError, match="8-bit integer tensor"):
        HiFloat8Tensor(data=torch.randn(4))
    with pytest.raises(ValueError, match="8-bit integer tensor"):
        HiFloat8Tensor(data=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="floating dtype"):
        HiFloat8Tensor(data=codes, dtype=torch.int32)
    with pytest.raises(ValueError, match="floating dtype"):
        h.from_hifloat8(torch.int64)
    with pytest.raises(ValueError, match="takes a tensor"):
        HiFloat8Tensor.to_hifloat8([1.0, 2.0])
