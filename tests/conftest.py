"""Suite-wide collection order: the longest tests first.

pytest-xdist hands work out in collection order. The suite's longest tests (npurun runs, compiled
training, the DistributedTest shards, the soak) used to come last, so one worker could still be running a
90 s test while the other had finished (the tail of the CI's 30-minute budget). Starting them first lets
the short tests fill in around them. The order is stable within each class, so every xdist worker
collects the same sequence (xdist requires it).
"""

# Path prefixes, longest total first (measured with --durations on the full suite: scripts/run_tests.sh prints the slowest).
LONG_FIRST = (
    "tests/compile/test_plan_compile_npurun.py",
    "tests/training/test_model_specs.py",
    "tests/training/test_checkpoint.py",
    "tests/compile/",
    "tests/training/test_parity.py",
    "tests/hccl/test_dist_suite.py",
    "tests/hccl/test_soak.py",
    "tests/launch/",
    "tests/ecosystem/test_deepspeed.py",   # two ranks importing DeepSpeed (setup.sh --test prebuilds cpu_adam)
    "tests/ecosystem/test_ray.py",
)


def _rank(nodeid: str) -> int:
    for i, prefix in enumerate(LONG_FIRST):
        if nodeid.startswith(prefix):
            return i
    return len(LONG_FIRST)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: _rank(item.nodeid))  # list.sort is stable: file order kept within a rank
