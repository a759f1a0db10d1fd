"""Ring attention (npudist.cp, method ring) on 2 ranks: the result and gradients of full causal attention, and
the next key/value block's send/recv in flight while the current block's attention runs, forward and
backward -- read off a torch.profiler trace of the issued ops (their order, not their timing)."""
from __future__ import annotations

import os

import pytest
import torch

from _ring_overlap import ring_worker
from _train_spawn import run_ranks

DEVICE = os.environ.get("NPUDIST_TEST_DEVICE", "npu")


@pytest.mark.timeout(120)
def test_ring_attention_overlaps_the_block_exchange_with_attention(tmp_path):
    out = str(tmp_path / "ring")
    run_ranks(ring_worker, 2, (DEVICE, out), str(tmp_path), timeout=100)
    for rank in range(2):
        res = torch.load(f"{out}.{rank}")
        for name, err in res["errors"].items():
            assert err < 1e-5, f"rank {rank}: {name} differs from full causal attention by {err}"
        assert res["order"] == issued_order(2), f"rank {rank}: {res['order']}"


def issued_order(n: int) -> list[str]:
    """What a cp-n ring issues: forward, each transfer of the next block before the current block's attention
    and its wait after it; backward, each step's transfer of the key/value gradient accumulator before that
    step's attention backward and its wait after it."""
    forward = ["ring_attention.exchange", "attention", "ring_attention.wait"] * (n - 1) + ["attention"]
    backward = ["attention_backward"] + ["ring_attention.exchange", "attention_backward",
                                         "ring_attention.wait"] * (n - 1)
    return forward + backward
