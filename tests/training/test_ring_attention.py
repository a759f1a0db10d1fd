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
        # Forward: the other rank's block is requested before attending to the own block and waited for after;
        # backward: the own block's key/value gradient share arrives while the own block's backward runs.
        assert res["order"] == [
            "ring_attention.exchange", "attention", "ring_attention.wait", "attention",
            "attention_backward", "ring_attention.exchange", "attention_backward", "ring_attention.wait",
        ], f"rank {rank}: {res['order']}"
