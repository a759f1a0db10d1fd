"""Scenarios: back-to-back collectives whose protocol paths differ and the seeded randomized soak."""
from __future__ import annotations

import torch
import torch.distributed as dist

from common import RANK, WS, init, scenario


def a2a_even(n_per_rank: int, dtype=torch.int32, device="cpu") -> None:
    """all_to_all_single of arange(n_per_rank * WS) + rank offset; checks every received element."""
    x = (torch.arange(n_per_rank * WS, dtype=torch.int64) + RANK * 1_000_003).to(dtype).to(device)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    want = torch.cat([(torch.arange(RANK * n_per_rank, (RANK + 1) * n_per_rank, dtype=torch.int64)
                       + r * 1_000_003).to(dtype) for r in range(WS)])
    assert torch.equal(out.cpu(), want), f"all_to_all_single n={n_per_rank} {dtype} on {device}: wrong values"


@scenario
def a2a_back_to_back():
    """Size sequences that cross the staged/direct/zero-copy paths, back to back."""
    init(timeout=30)
    sequences = [(250, 262144), (262144, 250), (1, 65536, 1), (250, 250, 262144, 262144, 7),
                 (70000, 3, 300000, 16, 131072)]
    for device in ("cpu", "npu"):
        for seq in sequences:
            for _ in range(3):
                for n in seq:
                    a2a_even(n, device=device)
    dist.barrier()
    dist.destroy_process_group()


@scenario
def rank_ahead():
    """Legal schedules where one rank runs a call ahead: a random rank does host work before or after each
    call, so peers that finished call N post call N+1 while it still reads call N. Nothing may be reported."""
    import random
    import time

    init(timeout=30)
    rng = random.Random(19)
    sizes = [1, 250, 16384, 65536, 70000, 262144, 300000]
    for i in range(60):
        slow = rng.randrange(WS)
        delay = rng.choice([0.0, 0.001, 0.01])
        device = rng.choice(["cpu", "npu"])
        n = rng.choice(sizes)
        if RANK == slow:
            time.sleep(delay)
        kind = rng.choice(["a2a", "all_reduce", "broadcast", "all_gather"])
        if kind == "a2a":
            a2a_even(n, device=device)
        elif kind == "all_reduce":
            t = torch.full((n * WS,), float(RANK + 1), device=device)
            dist.all_reduce(t)
            assert torch.all(t.cpu() == WS * (WS + 1) / 2), f"call {i}: all_reduce n={n * WS} wrong"
        elif kind == "broadcast":
            t = torch.full((n * WS,), float(RANK + i), device=device)
            dist.broadcast(t, src=i % WS)
            assert torch.all(t.cpu() == float(i % WS + i)), f"call {i}: broadcast wrong"
        else:
            out = torch.empty(n * WS, device=device)
            dist.all_gather_into_tensor(out, torch.full((n,), float(RANK), device=device))
            assert torch.equal(out.cpu(), torch.arange(WS).float().repeat_interleave(n)), f"call {i}: all_gather"
        if RANK == (slow + 1) % WS:
            time.sleep(delay)
    dist.barrier()
    dist.destroy_process_group()


@scenario
def a2a_real_mismatch():
    """Genuinely different calls still fail fast on every rank, naming the ranks: a rank that calls a
    different collective in the all_to_all's place, and a rank whose splits disagree with its peers'."""
    from common import expect_group_error

    init(timeout=20)
    a2a_even(250)
    x = torch.arange(262144 * WS, dtype=torch.int32)

    def other_collective(g):
        if RANK == 0:
            dist.all_gather_into_tensor(torch.empty(262144 * WS * WS, dtype=torch.int32), x, group=g)
        else:
            dist.all_to_all_single(torch.empty_like(x), x, group=g)

    expect_group_error(other_collective, "mismatched", "all_gather", "all_to_all")
    # Rank 0 sends five rows of float32 to rank 1, which expects four (as every other pair).
    ins, outs = [4] * WS, [4] * WS
    if RANK == 0:
        ins[1] = 5
    expect_group_error(lambda g: dist.all_to_all_single(torch.empty(sum(outs)), torch.zeros(sum(ins)),
                                                        output_split_sizes=outs, input_split_sizes=ins, group=g),
                       "split sizes", "rank 0 sends 20 bytes to rank 1")
    a2a_even(262144)  # the world group is still usable
    dist.destroy_process_group()


@scenario
def soak():
    """The seeded randomized soak (tests/hccl/soak.py). Args: seeds (comma-separated), ops per seed, max KiB."""
    import sys

    from soak import Soak

    seeds = [int(s) for s in sys.argv[2].split(",")]
    n_ops, max_kib = int(sys.argv[3]), int(sys.argv[4])
    init(timeout=60)
    for seed in seeds:
        s = Soak(seed, max_kib * 1024)
        s.run(n_ops)
        dist.barrier()
        for g, _ in s.groups[1:]:
            dist.destroy_process_group(g)
        print(f"SOAK DONE seed={seed} world={WS} rank={RANK} program={n_ops} executed={s.executed} "
              f"counts={s.counts}", flush=True)
    dist.destroy_process_group()
