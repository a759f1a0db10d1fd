"""examples/train.py with one fault: global rank 1 kills itself (SIGKILL) in the middle of the checkpoint save
of step $KILL_SAVE_STEP, after its shard files are written and before the save's metadata and rename.

Used by test_checkpoint.py under npurun; the patch is confined to this process."""
from __future__ import annotations

import os
import runpy
import signal

from torch.distributed.checkpoint import FileSystemWriter

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "train.py")
KILL_STEP = int(os.environ["KILL_SAVE_STEP"])
_write_data = FileSystemWriter.write_data


def _write_data_then_die(self, plan, planner):
    future = _write_data(self, plan, planner)
    if os.environ.get("RANK") == "1" and os.path.basename(str(self.path)).endswith(f"step-{KILL_STEP}"):
        future.wait()   # this rank's shards are on disk; the job has not finished the save
        os.kill(os.getpid(), signal.SIGKILL)
    return future


FileSystemWriter.write_data = _write_data_then_die
runpy.run_path(TRAIN, run_name="__main__")
