"""Back-to-back collectives whose protocol paths differ, legal schedules with a rank one call ahead,
genuine mismatches, and a bounded run of the seeded randomized soak (tests/hccl/soak.py).

The long soak is `python benchmarks/hccl_soak.py` (docs/hccl.md records its last result). A failure prints
`SOAK FAILURE seed=... op=...` with the command that replays it.
"""
import re

import pytest

from launcher import run_ranks


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_back_to_back_all_to_all_single(world_size):
    run_ranks("a2a_back_to_back", world_size, timeout=120)


@pytest.mark.parametrize("world_size", [2, 4])
def test_rank_ahead_by_one_call_waits(world_size):
    run_ranks("rank_ahead", world_size, timeout=120)


def test_genuinely_different_calls_still_fail():
    run_ranks("a2a_real_mismatch", 2, timeout=90)


# (world size, seeds, program ops per seed, largest buffer in KiB). Ops come in bursts of 1-5 calls, so this
# is about 1900 checked calls per rank; every threshold up to 1 MiB.
BOUNDED = [(2, "1,2", 250, 1100), (4, "3", 300, 600)]


@pytest.mark.parametrize("world_size,seeds,ops,max_kib", BOUNDED)
def test_randomized_soak_bounded(world_size, seeds, ops, max_kib):
    results = run_ranks("soak", world_size, args=(seeds, ops, max_kib), timeout=200)
    done = [line for r in results for line in r.output.splitlines() if line.startswith("SOAK DONE")]
    assert len(done) == world_size * len(seeds.split(",")), done
    executed = sum(int(re.search(r"executed=(\d+)", line).group(1)) for line in done)
    assert executed >= world_size * len(seeds.split(",")) * ops // 2, done
