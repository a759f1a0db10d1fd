"""Two simulated nodes x two ranks (NPUDIST_NODE_ID): hierarchical collectives over shm + Gloo."""
from launcher import run_ranks

NODES = {r: {"NPUDIST_NODE_ID": f"node{r // 2}"} for r in range(4)}
# Interleaved placement: node membership not contiguous in rank order.
INTERLEAVED = {r: {"NPUDIST_NODE_ID": f"node{r % 2}"} for r in range(4)}


def test_two_nodes_every_collective():
    run_ranks("collectives", 4, env={"HCCL_BUFFSIZE": "1", "HCCL_TEST_EXPECT_NODES": "2"},
              rank_env=NODES, timeout=220)


def test_two_nodes_interleaved_p2p_and_misc():
    run_ranks("p2p_and_misc", 4, env={"HCCL_BUFFSIZE": "1", "HCCL_TEST_EXPECT_NODES": "2"},
              rank_env=INTERLEAVED, timeout=200)


def test_uneven_nodes_three_ranks():
    """Node A holds ranks 0 and 2, node B rank 1 alone (a one-rank shm communicator, padded gathers)."""
    uneven = {0: {"NPUDIST_NODE_ID": "A"}, 1: {"NPUDIST_NODE_ID": "B"}, 2: {"NPUDIST_NODE_ID": "A"}}
    run_ranks("collectives", 3, env={"HCCL_BUFFSIZE": "1", "HCCL_TEST_EXPECT_NODES": "2"},
              rank_env=uneven, timeout=220)
