"""Two simulated nodes x two ranks (NPUDIST_NODE_ID): hierarchical collectives over shm + Gloo; the
Gloo communicator alone (NPUDIST_HCCL_COMMUNICATOR=gloo); the communicator choice."""
import datetime

import pytest
import torch
import torch.distributed as dist

from launcher import run_ranks

NODES = {r: {"NPUDIST_NODE_ID": f"node{r // 2}"} for r in range(4)}
# Interleaved placement: node membership not contiguous in rank order.
INTERLEAVED = {r: {"NPUDIST_NODE_ID": f"node{r % 2}"} for r in range(4)}
HIER = {"HCCL_BUFFSIZE": "1", "HCCL_TEST_EXPECT_NODES": "2", "HCCL_TEST_EXPECT_COMMUNICATOR": "hierarchical"}
GLOO = {"HCCL_BUFFSIZE": "1", "NPUDIST_HCCL_COMMUNICATOR": "gloo", "HCCL_TEST_EXPECT_COMMUNICATOR": "gloo"}


def test_two_nodes_every_collective():
    run_ranks("collectives", 4, env=HIER,
              rank_env=NODES, timeout=220)


def test_two_nodes_interleaved_p2p_and_misc():
    run_ranks("p2p_and_misc", 4, env=HIER,
              rank_env=INTERLEAVED, timeout=200)


def test_uneven_nodes_three_ranks():
    """Node A holds ranks 0 and 2, node B rank 1 alone (a one-rank shm communicator, padded gathers)."""
    uneven = {0: {"NPUDIST_NODE_ID": "A"}, 1: {"NPUDIST_NODE_ID": "B"}, 2: {"NPUDIST_NODE_ID": "A"}}
    run_ranks("collectives", 3, env=HIER,
              rank_env=uneven, timeout=220)


def test_gloo_communicator_every_collective_npu():
    """The whole group over GlooCommunicator (one node): every op, dtype and reduce op on npu tensors."""
    run_ranks("collectives", 2, env=GLOO, args=("npu",), timeout=200)


def test_gloo_communicator_p2p_and_misc():
    run_ranks("p2p_and_misc", 2, env=GLOO, timeout=150)


def _one_rank_group():
    import npudist.hccl as hccl

    opts = hccl.ProcessGroupHCCL.Options(datetime.timedelta(seconds=30))
    return hccl.ProcessGroupHCCL(dist.HashStore(), 0, 1, opts)


def test_communicator_chosen_by_topology_and_env(monkeypatch):
    monkeypatch.delenv("NPUDIST_HCCL_COMMUNICATOR", raising=False)
    pg = _one_rank_group()
    assert (pg.communicator, pg.uses_gloo) == ("shm", False)
    monkeypatch.setenv("NPUDIST_HCCL_COMMUNICATOR", "gloo")
    pg = _one_rank_group()
    assert (pg.communicator, pg.uses_gloo) == ("gloo", True)
    t = torch.arange(5, dtype=torch.float32)
    pg.allreduce([t]).wait()
    assert torch.equal(t, torch.arange(5, dtype=torch.float32))


def test_communicator_env_rejects_unknown_value(monkeypatch):
    monkeypatch.setenv("NPUDIST_HCCL_COMMUNICATOR", "nccl")
    with pytest.raises(ValueError, match="NPUDIST_HCCL_COMMUNICATOR='nccl'.*'auto'.*'gloo'"):
        _one_rank_group()
