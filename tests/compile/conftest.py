"""Shared setup for graph-mode tests.

Inductor compiles C++ with g++; one cache directory per test run (shared by the xdist workers of the run)
lets later tests and workers reuse kernels. One compile thread: no compile worker processes outlive a test.
"""
import os

import pytest

import npudist  # noqa: F401  (registers the npu device)

os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"


@pytest.fixture(scope="session", autouse=True)
def inductor_cache_dir(tmp_path_factory, worker_id):
    # Under xdist every worker's basetemp is <run root>/popen-gwN: the run root is shared, and pytest
    # removes old run roots itself.
    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent
    path = root / "inductor-cache"
    path.mkdir(exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path
