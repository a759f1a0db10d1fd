"""Flight-recorder scenarios whose dumps both analyzers read (test_flight_recorder_format.py)."""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from common import RANK, WS, expect_error, init, scenario


@scenario
def staged_mismatch():
    """Ranks agree on three collectives, then disagree on the 4th: `size` (all_reduce of 8 vs 9 elements on
    the last rank) or `op` (all_reduce vs broadcast). Both fail; every rank's watchdog dumps."""
    kind = sys.argv[2]
    init(timeout=10)
    t = torch.ones(8)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.all_reduce(t)
    last = RANK == WS - 1
    if kind == "size":
        call = lambda: dist.all_reduce(torch.ones(9) if last else torch.ones(8))  # noqa: E731
    elif kind == "op":
        call = lambda: dist.broadcast(torch.ones(8), 0) if last else dist.all_reduce(torch.ones(8))  # noqa: E731
    else:
        raise ValueError(f"staged_mismatch: kind must be 'size' or 'op', got {kind!r}")
    expect_error(call, dist.DistBackendError, "mismatch")
    path = os.environ["TORCH_HCCL_DEBUG_INFO_TEMP_FILE"] + str(RANK)
    deadline = time.monotonic() + 10
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)  # the watchdog writes the dump within its next round
    assert os.path.exists(path), f"no flight-recorder dump at {path}"
    dist.destroy_process_group()


@scenario
def fr_dump_formats():
    """dump_flight_recorder(): PyTorch's dump (version, pg_config, pg_status, entries with NCCL's keys and
    profiling names) for collectives and p2p ops of two groups."""
    import pickle

    import npudist.hccl as hccl

    init()
    sub = dist.new_group(group_desc="sub_pg")
    t = torch.ones(4, 2)
    dist.all_reduce(t)
    dist.all_gather_into_tensor(torch.empty(4 * WS, 2), t)
    dist.all_gather([torch.empty(4, 2) for _ in range(WS)], t)
    dist.reduce_scatter_tensor(torch.empty(2, 2), torch.ones(2 * WS, 2))
    if RANK == 0:
        dist.send(torch.ones(3), 1)
    elif RANK == 1:
        dist.recv(torch.empty(3), 0)
    dist.all_reduce(torch.ones(5, dtype=torch.bfloat16), group=sub)
    doc = pickle.loads(hccl.dump_flight_recorder("test"))
    from torch.distributed.flight_recorder.components.utils import get_version_detail

    assert get_version_detail(doc["version"]) >= (2, 10), doc["version"]
    assert doc["hccl_rank"] == RANK and doc["hccl_reason"] == "test", doc
    world = [n for n, c in doc["pg_config"].items() if c["desc"] == "default_pg"]
    assert len(world) == 1 and doc["pg_config"][world[0]]["ranks"] == str(list(range(WS))), doc["pg_config"]
    subname = [n for n, c in doc["pg_config"].items() if c["desc"] == "sub_pg"]
    assert len(subname) == 1, doc["pg_config"]
    ents = doc["entries"]
    assert [e["record_id"] for e in ents] == sorted(e["record_id"] for e in ents)
    names = [(e["process_group"], e["profiling_name"]) for e in ents]
    wp, sp = (world[0], "default_pg"), (subname[0], "sub_pg")
    p2p = [(wp, "hccl:send 0->1")] if RANK == 0 else [(wp, "hccl:recv 1<-0")] if RANK == 1 else []
    assert names == [(wp, "hccl:all_reduce"), (wp, "hccl:_all_gather_base"), (wp, "hccl:all_gather"),
                     (wp, "hccl:_reduce_scatter_base"), *p2p, (sp, "hccl:all_reduce")], names
    ar, agb, ag, rs = ents[:4]
    assert ar["input_sizes"] == ar["output_sizes"] == [[4, 2]] and ar["input_dtypes"] == ["Float"], ar
    assert agb["output_sizes"] == [[4 * WS, 2]], agb
    assert ag["output_sizes"] == [[WS, 4, 2]], ag  # the per-rank list recorded flat, as NCCL does
    assert rs["input_sizes"] == [[2 * WS, 2]] and rs["output_sizes"] == [[2, 2]], rs
    assert [e["collective_seq_id"] for e in ents[:4]] == [1, 2, 3, 4]
    # Wall-clock times since the epoch (the recorder keeps the steady clock and converts at the dump).
    assert abs(ar["time_created_ns"] - time.time_ns()) < 600e9, (ar["time_created_ns"], time.time_ns())
    assert all(e["state"] == "completed" and e["retired"] and e["time_discovered_completed_ns"] >= e["time_created_ns"]
               and e["duration_ms"] >= 0 and not e["is_p2p"] for e in ents[:4]), ents[:4]
    if p2p:
        e = ents[4]
        assert e["is_p2p"] and e["p2p_seq_id"] == 1 and e["collective_seq_id"] == 4, e
        assert (e["input_sizes"] if RANK == 0 else e["output_sizes"]) == [[3]], e
    last = ents[-1]
    assert last["input_dtypes"] == ["BFloat16"] and last["collective_seq_id"] == 1, last
    assert last["op_id"] == 1 and ents[3]["op_id"] == 4, (last, ents[3])
    status = doc["pg_status"][str(ar["pg_id"])]
    assert status == {"last_enqueued_collective": 4, "last_started_collective": 4,
                      "last_completed_collective": 4}, status
    # Every other op kind, for fr_trace to match across ranks (it rejects names outside NCCL's vocabulary).
    x = torch.ones(2 * WS)
    dist.broadcast(x, 0)
    dist.reduce(x, 0)
    dist.all_to_all_single(torch.empty(2 * WS), x)
    dist.all_to_all([torch.empty(2) for _ in range(WS)], list(x.chunk(WS)))
    dist.gather(torch.ones(2), [torch.empty(2) for _ in range(WS)] if RANK == 0 else None, dst=0)
    dist.scatter(torch.empty(2), list(x.chunk(WS)) if RANK == 0 else None, src=0)
    dist.reduce_scatter(torch.empty(2), list(x.chunk(WS)))
    dist.barrier()
    hccl.dump_flight_recorder_to_file()
    dist.destroy_process_group()
