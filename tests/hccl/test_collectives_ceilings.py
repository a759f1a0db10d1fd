"""The copy-bound ceilings of benchmarks/collectives.py against docs/hccl_engine.md ("Copy-bound ceilings"):
the one-copy reference and, for cpu tensors, the staged and cross-memory-attach routes and the platform
ceiling (the cheaper route). Pure arithmetic: nothing is timed."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))

import collectives as c  # noqa: E402

S = 1 << 20


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_one_copy_reference(n):
    assert c.ceiling_copy_bytes("broadcast", n, S) == (n - 1) * S
    assert c.ceiling_copy_bytes("reduce_scatter_tensor", n, S) == (n + 1) * S / 2
    for op in ("all_gather_into_tensor", "all_reduce", "all_to_all_single", "all_to_all_single_uneven"):
        assert c.ceiling_copy_bytes(op, n, S) == n * S


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("rho", [0.25, 0.66, 1.0, 1.5])
def test_routes_match_the_derivation(n, rho):
    def routes(op):
        r = c.cpu_route_copy_bytes(op, n, S, rho)
        return r["staged"], r["cma"]

    assert routes("broadcast") == pytest.approx((n * S, (n - 1) * S / rho))
    assert routes("all_gather_into_tensor") == pytest.approx(((n + 1) * S, S + (n - 1) * S / rho))
    assert routes("all_to_all_single") == pytest.approx(((2 * n - 1) * S, S + (n - 1) * S / rho))
    assert routes("reduce_scatter_tensor") == pytest.approx(((3 * n - 1) * S / 2, (n + 1) * S / 2 + (n - 1) * S / rho))
    assert routes("all_reduce") == pytest.approx(((5 * n - 2) * S / 2, (n + 1) * S / 2 + 2 * (n - 1) * S / rho))


def test_uneven_all_to_all_keeps_the_diagonal():
    # The benchmark's splits: rank i sends 1 + (i + j) % n units to rank j, n (n + 1) / 2 units in all.
    assert c.kept_bytes("all_to_all_single_uneven", 2, 3 * S) == pytest.approx(2 * S)
    assert c.kept_bytes("all_to_all_single_uneven", 4, 10 * S) == pytest.approx(8 * S)
    assert c.kept_bytes("all_to_all_single", 4, S) == S
    r = c.cpu_route_copy_bytes("all_to_all_single_uneven", 4, 10 * S, 0.5)
    assert r["staged"] == pytest.approx(2 * (40 - 8) * S + 8 * S)
    assert r["cma"] == pytest.approx(8 * S + (40 - 8) * S / 0.5)


@pytest.mark.parametrize("n", [2, 4])
def test_platform_ceiling_takes_the_cheaper_route(n):
    # Crossovers from the docs: broadcast and all_gather at rho = (n-1)/n, all_to_all at 1/2,
    # reduce_scatter at 1, all_reduce at 4(n-1)/(4n-3).
    crossover = {"broadcast": (n - 1) / n, "all_gather_into_tensor": (n - 1) / n, "all_to_all_single": 0.5,
                 "all_to_all_single_uneven": 0.5, "reduce_scatter_tensor": 1.0, "all_reduce": 4 * (n - 1) / (4 * n - 3)}
    for op, x in crossover.items():
        assert c.platform_ceiling(op, n, S, x * 0.95)[0] == "staged", op
        assert c.platform_ceiling(op, n, S, x * 1.05)[0] == "cma", op
        route, copy_bytes = c.platform_ceiling(op, n, S, x * 1.05)
        assert copy_bytes == min(c.cpu_route_copy_bytes(op, n, S, x * 1.05).values())


@pytest.mark.parametrize("rho", [None, 0.0])
def test_refused_cma_leaves_the_staged_route(rho):
    for op in c.OPS:
        route, copy_bytes = c.platform_ceiling(op, 2, S, rho)
        assert route == "staged"
        assert copy_bytes == c.cpu_route_copy_bytes(op, 2, S, 1.0)["staged"]


def test_cpu_rows_report_the_platform_ceiling_and_npu_rows_do_not():
    # 2 ranks, 1 MiB all_gather; R = 10 GB/s, CMA 6 GB/s (rho 0.6 > 1/2: the CMA route, S + S/rho).
    row = {"op": "all_gather_into_tensor", "n": 2, "bytes": S, "roofline_gbps": 10.0, "cma_gbps": 6.0,
           "hccl_cpu_s": 1e-3, "hccl_npu_s": 1e-3, "gloo_s": 2e-3}
    d = c.derived(row, "cpu")
    platform_s = (S + S / 0.6) / 10e9
    assert d["rho"] == pytest.approx(0.6)
    assert d["platform_route"] == "cma"
    assert d["platform_pct"] == pytest.approx(100 * platform_s / 1e-3)
    assert d["ceiling_pct"] == pytest.approx(100 * (2 * S / 10e9) / 1e-3)  # the one-copy reference, unchanged
    assert c.derived(row, "npu")["platform_pct"] is None
    # The cpu target is evaluated on the platform ceiling.
    fast = dict(row, hccl_cpu_s=platform_s / 0.85)
    slow = dict(row, hccl_cpu_s=platform_s / 0.75)
    assert c.check_targets([fast], ["cpu"])[0].startswith("[met]")
    assert c.check_targets([slow], ["cpu"])[0].startswith("[MISSED]")
    assert "platform ceiling" in c.check_targets([slow], ["cpu"])[0]
