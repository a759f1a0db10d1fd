"""One rank of a multi-process hccl test scenario (started by tests/hccl/launcher.py).

Usage: worker.py <scenario> [args...]; RANK/WORLD_SIZE/HCCL_TEST_STORE come from the environment.
Each scenario checks results against references computed locally (every rank can rebuild every rank's
input from its seed) and prints "SCENARIO OK" at the end.
"""
import sys

import scen_capabilities  # noqa: F401  (registers scenarios)
import scen_comm_hooks  # noqa: F401
import scen_extras  # noqa: F401
import scen_faults  # noqa: F401
import scen_flight_recorder  # noqa: F401
import scen_groups  # noqa: F401
import scen_hccl_env  # noqa: F401
import scen_ops  # noqa: F401
import scen_soak  # noqa: F401
import scen_zero_copy  # noqa: F401
from common import SCENARIOS

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    print("SCENARIO OK", flush=True)
