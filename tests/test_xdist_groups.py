"""The suite's `xdist_group` marks take effect under the README's command (`pytest -n 2 --dist loadgroup`).

Several files rely on them (one wheel build, one inductor cache, one device mesh at a time per group); with a
pytest whose node ids pytest-xdist cannot rewrite (pytest 9 with xdist 3.8) the marks are silently ignored and
those files' tests spread over both workers. requirements-test.txt pins a pair that groups."""
import pytest

pytestmark = [pytest.mark.xdist_group("scheduling_check")]


def test_xdist_group_marks_take_effect(request):
    if not getattr(request.config.option, "loadgroup", False):   # set on xdist's workers under --dist loadgroup
        pytest.skip("checks xdist's --dist loadgroup, as scripts/run_tests.sh runs the suite")
    # loadgroup schedules by the "@<group>" suffix it adds to each marked test's node id
    assert request.node.nodeid.endswith("@scheduling_check"), (
        f"xdist did not group {request.node.nodeid!r}: this pytest/pytest-xdist pair ignores xdist_group marks "
        "(install requirements-test.txt's pins)")
