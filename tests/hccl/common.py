"""Shared helpers of the hccl test scenarios: rank identity, init, deterministic inputs, local
references, tolerance-aware comparison, expected-error checks, and the scenario registry."""
from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import npudist  # noqa: F401,E402  (registers the npu device and the hccl backend)

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
SCENARIOS = {}
# The world's nodes (lists of ranks, ascending) when init() built a hierarchical hccl group: fp16/bf16
# reductions over the whole world are then rounded once per node and once more between nodes.
NODES: list[list[int]] | None = None


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def init(backend="hccl", timeout=60.0, **kw):
    dist.init_process_group(backend, init_method="file://" + os.environ["HCCL_TEST_STORE"], rank=RANK,
                            world_size=WS, timeout=timedelta(seconds=timeout), **kw)
    expect = os.environ.get("HCCL_TEST_EXPECT_NODES")
    if expect and backend == "hccl":
        be = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert be.num_nodes == int(expect) and be.uses_gloo, (be.num_nodes, be.uses_gloo)
    expect_comm = os.environ.get("HCCL_TEST_EXPECT_COMMUNICATOR")
    if expect_comm and backend == "hccl":
        be = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert be.communicator == expect_comm, (be.communicator, expect_comm)
    if backend == "hccl" and dist.group.WORLD._get_backend(torch.device("cpu")).communicator == "hierarchical":
        global NODES
        ids = [None] * WS
        dist.all_gather_object(ids, os.environ.get("NPUDIST_NODE_ID") or os.uname().nodename)
        NODES = [[r for r in range(WS) if ids[r] == i] for i in dict.fromkeys(ids)]


# ------------------------------------------------------------------------------------------------
# Inputs and references

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
COMPLEX = [torch.complex64, torch.complex128]
ALL_DTYPES = FLOATS + INTS + [torch.bool] + COMPLEX
R = dist.ReduceOp


def make(rank: int, n: int, dtype: torch.dtype, salt: int = 0, small: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + 7 * salt + n)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float64)
        return (x * 0.5 + 1.0 if small else x).to(dtype)
    if dtype.is_complex:
        return torch.randn(n, generator=g, dtype=dtype)
    lo, hi = (1, 3) if small else ((0, 10) if dtype == torch.uint8 else (-5, 6))
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


LOW_PRECISION = (torch.float16, torch.bfloat16)


def _fold_fp32(xs: list[torch.Tensor], op) -> torch.Tensor:
    """xs[0] op xs[1] op ... in fp32, left to right: the engine's kernel (reduce_kernels.h) widens every
    input to fp32 and combines them in rank order, and IEEE fp32 operations in the same order give the
    same bits here."""
    acc = xs[0].float()
    for x in xs[1:]:
        x = x.float()
        acc = acc + x if op == R.SUM else acc * x if op == R.PRODUCT else (
            torch.minimum(acc, x) if op == R.MIN else torch.maximum(acc, x))
    return acc


def low_precision_reference(xs: list[torch.Tensor], op, scale: float = 1.0) -> torch.Tensor:
    """hccl's fp16/bf16 reduction as docs/hccl_engine.md defines it: accumulate in fp32 across all inputs
    (rank order), multiply by the scale in fp32 (AVG: 1/size, PREMUL_SUM: the factor), round once. A
    hierarchical world (NODES) rounds each node's unscaled partial to the dtype, then combines the
    partials the same way (docs/hccl.md, "Several nodes"). Compared bitwise: an engine accumulating in
    fp16/bf16 rounds after every step and differs from this in the last bits."""
    dtype = xs[0].dtype
    if op == R.AVG:
        op, scale = R.SUM, 1.0 / len(xs)
    if NODES is not None and len(NODES) > 1 and len(xs) == WS:
        xs = [_fold_fp32([xs[r] for r in node], op).to(dtype) for node in NODES]
    acc = _fold_fp32(xs, op)
    if scale != 1.0:
        acc = acc * torch.tensor(scale, dtype=torch.float32)
    return acc.to(dtype)


def reference(xs: list[torch.Tensor], op, scale: float = 1.0) -> torch.Tensor:
    """The reduction of xs (one tensor per rank, in group-rank order) by `op`, then times `scale`
    (PREMUL_SUM's factor)."""
    dtype = xs[0].dtype
    if dtype in LOW_PRECISION:
        return low_precision_reference(xs, op, scale)
    s = torch.stack(xs)
    if dtype == torch.bool:
        if op in (R.SUM, R.MAX, R.BOR):
            return s.any(0)
        if op in (R.PRODUCT, R.MIN, R.BAND):
            return s.all(0)
        return (s.to(torch.int64).sum(0) % 2).bool()
    acc = torch.complex128 if dtype.is_complex else (torch.float64 if dtype.is_floating_point else torch.int64)
    w = s.to(acc)
    if op == R.SUM:
        r = w.sum(0) * scale if scale != 1.0 else w.sum(0)
    elif op == R.AVG:
        r = w.sum(0) / len(xs) if (dtype.is_floating_point or dtype.is_complex) else torch.div(
            w.sum(0), len(xs), rounding_mode="trunc")
    elif op == R.PRODUCT:
        r = w.prod(0)
    elif op == R.MIN:
        r = w.amin(0)
    elif op == R.MAX:
        r = w.amax(0)
    elif op in (R.BAND, R.BOR, R.BXOR):
        r = s[0].clone()
        for x in s[1:]:
            r = r & x if op == R.BAND else (r | x if op == R.BOR else r ^ x)
        return r
    else:
        raise AssertionError(op)
    return r.to(dtype)


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
    if dtype.is_complex:
        return [R.SUM, R.AVG]
    if dtype.is_floating_point:
        return [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, "PREMUL"]
    return [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if a.dtype in LOW_PRECISION:
        # Bitwise: the reference rounds exactly where hccl does (low_precision_reference).
        a, b = a.reshape(-1), b.reshape(-1)
        bad = (a.view(torch.int16) != b.view(torch.int16)).nonzero().flatten()
        if len(bad):
            raise AssertionError(f"{what}: {len(bad)} of {a.numel()} elements differ from the fp32-accumulated "
                                 f"reference, first at {bad[:4].tolist()}\n got {a[bad[:8]]}\n"
                                 f"want {b[bad[:8]]}")
        return
    if a.dtype in (torch.float32, torch.complex64):
        tol = dict(rtol=1e-5, atol=1e-5)
    else:
        tol = dict(rtol=1e-12, atol=1e-12) if (a.is_floating_point() or a.is_complex()) else dict(rtol=0, atol=0)
    if not torch.allclose(a.to(torch.complex128) if a.is_complex() else a.double(),
                          b.to(torch.complex128) if b.is_complex() else b.double(), **tol):
        raise AssertionError(f"{what}: mismatch\n got {a[:8]}\nwant {b[:8]}")



def expect_error(fn, types, *needles):
    import time as _t

    t0 = _t.monotonic()
    try:
        fn()
    except types as e:
        msg = str(e)
        for n in needles:
            assert n in msg, f"error text lacks {n!r}: {msg}"
        print(f"rank {RANK}: expected {type(e).__name__} after {_t.monotonic() - t0:.1f}s: {msg[:400]}",
              flush=True)
        return msg, _t.monotonic() - t0
    raise AssertionError(f"no {types} raised")


def expect_group_error(call, *needles, within: float = 5.0):
    """Runs call(group) on a fresh group of all ranks (10 s timeout); it must raise DistBackendError
    containing `needles` within `within` seconds. The group is destroyed afterwards."""
    from datetime import timedelta

    import torch.distributed as dist

    g = dist.new_group(timeout=timedelta(seconds=10))
    msg, took = expect_error(lambda: call(g), dist.DistBackendError, *needles)
    assert took < within, f"error took {took:.1f}s: {msg[:200]}"
    dist.destroy_process_group(g)
    return msg

