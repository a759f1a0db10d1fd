"""Scenario: large collectives on npu tensors run zero-copy (peers map each other's npu memory) and give
the same results as the local references; cpu tensors and NPUDIST_ENGINE_ZERO_COPY=0 take the staged path."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from common import WS, RANK, R, close, init, make, reference, scenario

N = 300_001  # odd, and 1.2 MB of float32: above the 256 KiB zero-copy threshold


def run_ops(device: str) -> int:
    """Every zero-copy-capable op once (or more) on `device`; returns how many ops ran."""
    ops = 0
    for dtype, op in [(torch.float32, R.SUM), (torch.bfloat16, R.AVG), (torch.int64, R.MAX)]:
        xs = [make(r, N, dtype, salt=21) for r in range(WS)]
        t = xs[RANK].clone().to(device)
        dist.all_reduce(t, op=op)
        close(t, reference(xs, op), f"all_reduce {dtype} {op} on {device}")
        ops += 1
    big = [make(r, N * WS, torch.float32, salt=22) for r in range(WS)]
    out = torch.empty(N, device=device)
    dist.reduce_scatter_tensor(out, big[RANK].to(device))
    close(out, reference(big, R.SUM)[RANK * N:(RANK + 1) * N], f"reduce_scatter_tensor on {device}")
    xs = [make(r, N, torch.float32, salt=23) for r in range(WS)]
    flat = torch.empty(N * WS, device=device)
    dist.all_gather_into_tensor(flat, xs[RANK].to(device))
    close(flat, torch.cat(xs), f"all_gather_into_tensor on {device}")
    flat = torch.zeros(N * WS, device=device)           # in place: the input is this rank's block of the output
    flat[RANK * N:(RANK + 1) * N] = xs[RANK].to(device)
    dist.all_gather_into_tensor(flat, flat[RANK * N:(RANK + 1) * N])
    close(flat, torch.cat(xs), f"all_gather_into_tensor in place on {device}")
    t = xs[RANK].clone().to(device)
    dist.broadcast(t, src=WS - 1)
    close(t, xs[WS - 1], f"broadcast on {device}")
    ops += 4

    def split(i, j):  # uneven: rank i sends 40_000 * ((i + j) % 3 + 1) rows of 2 to rank j
        return 40_000 * ((i + j) % 3 + 1)

    rows = [[make(i, 2 * split(i, j), torch.float32, salt=24 + j).view(-1, 2) for j in range(WS)] for i in range(WS)]
    out = torch.empty(sum(split(i, RANK) for i in range(WS)), 2, device=device)
    dist.all_to_all_single(out, torch.cat(rows[RANK]).to(device), output_split_sizes=[split(i, RANK) for i in range(WS)],
                           input_split_sizes=[split(RANK, j) for j in range(WS)])
    close(out, torch.cat([rows[i][RANK] for i in range(WS)]), f"all_to_all_single uneven on {device}")
    # A ring exchange as ring attention does it: larger than the p2p ring (1 MiB), so an npu send is read
    # once, in place, by its receiver.
    nxt, prv = (RANK + 1) % WS, (RANK - 1) % WS
    got = torch.empty(N, device=device)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, xs[RANK].to(device), nxt),
                                    dist.P2POp(dist.irecv, got, prv)])
    for w in works:
        w.wait()
    close(got, xs[prv], f"ring isend/irecv on {device}")
    return ops + 2


@scenario
def zero_copy():
    init()
    be = dist.group.WORLD._get_backend(torch.device("npu"))
    enabled = os.environ.get("NPUDIST_ENGINE_ZERO_COPY") != "0"
    before = be.zero_copy_ops
    ops = run_ops("npu")
    got = be.zero_copy_ops - before
    assert got == (ops if enabled else 0), f"{got} of {ops} npu collectives ran zero-copy (enabled={enabled})"

    # Buffers in private memory always take the staged path.
    before = be.zero_copy_ops
    run_ops("cpu")
    assert be.zero_copy_ops == before, "a cpu-tensor collective ran zero-copy"

    # One rank releases its cached segments (peers must drop their stale mappings) and allocates anew.
    if RANK == 0:
        torch.npu.empty_cache()
    for _ in range(3):
        xs = [make(r, N, torch.float32, salt=25) for r in range(WS)]
        t = xs[RANK].to("npu")
        dist.all_reduce(t)
        close(t, reference(xs, R.SUM), "all_reduce after empty_cache")
        del t
        if RANK == 0:
            torch.npu.empty_cache()
    dist.barrier()
    dist.destroy_process_group()
