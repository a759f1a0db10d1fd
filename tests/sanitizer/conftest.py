import os
import sys

import pytest

from npudist.device import sanitizer

# The spawn-with-timeout helper the plan tests use (tests/plan/dist_helpers.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plan"))


@pytest.fixture
def san():
    """The stream sanitizer, enabled for one test."""
    assert not sanitizer.is_enabled()
    s = sanitizer.enable()
    try:
        yield s
    finally:
        sanitizer.disable()
