"""dtypes CUDA accepts and the CPU kernels refuse (tests/data/cuda_dtype_gaps.json, from
scripts/cuda_dtype_gaps.py): the pairs npudist computes (npudist.device.cuda_dtypes.COMPUTED) give CUDA's
result, checked against a reference computed independently on the cpu (exact integer binning for histc, the
wider dtype for the rest); every other refused pair still raises on npu, so the list cannot go stale."""
from __future__ import annotations

import json
import pathlib

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from npudist.device.cuda_dtypes import COMPUTED

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "cuda_dtype_gaps.json"
GAPS = [r for r in json.loads(DATA.read_text()) if r["cpu"] in ("refuses", "mixed")]
OPS = {(op.name, op.variant_test_name): op for op in op_db}


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _computed(row) -> bool:
    return _dtype(row["dtype"]) in COMPUTED.get(row["op"], ())


def _samples(row, device):
    op = OPS[(row["op"], row["variant"])]
    return op, list(op.sample_inputs(device, _dtype(row["dtype"]), requires_grad=False))


_min = min


def histc_reference(x, bins=100, min=0, max=0):  # noqa: A002
    values = [int(v) for v in x.reshape(-1).tolist()]
    lo, hi = int(min), int(max)
    if lo == hi and values:
        lo, hi = sorted(values)[0], sorted(values)[-1]
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts = [0] * bins
    for v in values:
        if lo <= v <= hi:
            counts[_min((v - lo) * bins // (hi - lo), bins - 1)] += 1
    return torch.tensor(counts, dtype=x.dtype)


def reference(row, sample):
    x = sample.input
    if row["op"] == "histc":
        return histc_reference(x, *sample.args, **sample.kwargs)
    if row["op"] == "trace":
        return x.diagonal().to(torch.int64).sum()
    wide = x.to(torch.complex128)
    zeroed = torch.where(torch.isnan(wide), torch.zeros((), dtype=torch.complex128), wide)
    kwargs = dict(sample.kwargs)
    dtype = kwargs.pop("dtype", None)
    dim = kwargs.pop("dim", sample.args[0] if sample.args else None)
    keepdim = kwargs.pop("keepdim", sample.args[1] if len(sample.args) > 1 else False)
    dim = None if dim in (None, []) else dim
    if row["op"] == "nansum":
        out = zeroed.sum(dim=dim, keepdim=keepdim)
    else:
        count = (~torch.isnan(wide)).sum(dim=dim, keepdim=keepdim)
        out = zeroed.sum(dim=dim, keepdim=keepdim) / count
    return out.to(dtype if dtype is not None else x.dtype)


def test_the_class_is_recorded():
    pairs = {(r["op"], r["dtype"]) for r in GAPS}
    assert ("histc", "int64") in pairs and len(pairs) >= 60


@pytest.mark.parametrize("row", [r for r in GAPS if _computed(r)], ids=lambda r: f"{r['op']}-{r['dtype']}")
def test_computed_pairs_match_the_reference(row):
    op, samples = _samples(row, "cpu")
    assert samples
    for s in samples:
        got = op(s.input.to("npu"), *s.args, **s.kwargs)
        want = reference(row, s)
        assert got.device.type == "npu" and got.dtype == want.dtype, (got.dtype, want.dtype)
        if want.dtype == torch.complex32:
            torch.testing.assert_close(got.cpu().to(torch.complex64), want.to(torch.complex64), equal_nan=True,
                                       rtol=1e-3, atol=1e-3)
        else:
            torch.testing.assert_close(got.cpu(), want, equal_nan=True, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("row", [r for r in GAPS if not _computed(r)], ids=lambda r: f"{r['op']}-{r['dtype']}")
def test_other_pairs_still_raise_on_npu(row):
    op, samples = _samples(row, "cpu")
    raised = 0
    for s in samples[:3]:
        try:
            op(s.input.to("npu"), *[a.to("npu") if isinstance(a, torch.Tensor) else a for a in s.args], **s.kwargs)
            torch.npu.synchronize()
        except (RuntimeError, NotImplementedError):
            raised += 1
    assert raised, f"{row['op']} {row['dtype']} now runs on npu: add it to COMPUTED with a reference test"


def test_histc_int64_as_torchtitan_router_calls_it():
    experts = torch.tensor([[0, 3], [3, 1], [7, 3]], device="npu")
    counts = torch.histc(experts.view(-1), bins=8, min=0, max=8)
    assert counts.dtype == torch.int64 and counts.tolist() == [1, 1, 0, 3, 0, 0, 0, 1]
    floats = torch.rand(64, device="npu")
    assert torch.equal(torch.histc(floats, 5).cpu(), torch.histc(floats.cpu(), 5))   # CPU kernel, bitwise
