"""Torch-free rank layout agrees with torch: init_device_mesh's row-major order (checked in test_mesh) and
pipelining's stage-to-rank mapping (checked here without processes)."""
import pytest
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

from npudist.plan.ranks import group_ranks, rank_coordinates, rank_of, stage_layer_ranges, stages_of_rank
from npudist.plan.schema import ParallelDegrees

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("pp,virtual,schedule,style", [
    (2, 2, "Interleaved1F1B", "loop"), (4, 2, "InterleavedZeroBubble", "loop"), (2, 3, "Interleaved1F1B", "loop"),
    (2, 2, "ZBVZeroBubble", "v"), (4, 2, "ZBVZeroBubble", "v"), (4, 1, "1F1B", "loop"),
])
def test_stages_of_rank_matches_torch(pp, virtual, schedule, style):
    torch_map = generate_stage_to_rank_mapping(pp, pp * virtual, style=style)
    for rank in range(pp):
        assert stages_of_rank(rank, pp, virtual, schedule) == sorted(s for s, r in torch_map.items() if r == rank)


def test_stage_layer_ranges():
    assert stage_layer_ranges(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert stage_layer_ranges(5, 2, [2]) == [range(0, 2), range(2, 5)]
    with pytest.raises(ValueError, match="not divisible"):
        stage_layer_ranges(5, 2)
    with pytest.raises(ValueError, match="strictly increasing"):
        stage_layer_ranges(6, 3, [3, 3])


def test_coordinates_round_trip_and_groups():
    d = ParallelDegrees(pp=2, dp_replicate=1, dp_shard=2, tp=2)
    for rank in range(8):
        assert rank_of(d, rank_coordinates(d, rank)) == rank
    assert rank_coordinates(d, 5) == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 1}
    assert group_ranks(d, "tp", 5) == [4, 5]
    assert group_ranks(d, "dp_shard", 5) == [5, 7]
    assert group_ranks(d, "pp", 5) == [1, 5]
    assert group_ranks(d, "dp_replicate", 5) == [5]
    with pytest.raises(ValueError, match="outside the world"):
        rank_coordinates(d, 8)
