"""Worker for CPU (gloo) launcher tests: reports what the launcher gave it, checks an all_reduce."""
import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
info = {
    "rank": rank, "world": world, "local_rank": int(os.environ["LOCAL_RANK"]),
    "group_rank": int(os.environ["GROUP_RANK"]), "sum": t.item(), "argv": sys.argv[1:],
    "name": __name__, "path0": sys.path[0], "node_id": os.environ.get("NPUDIST_NODE_ID"),
    "job_id": os.environ.get("NPUDIST_JOB_ID"), "run_id": os.environ["TORCHELASTIC_RUN_ID"],
    "hccl_timeout": os.environ.get("HCCL_EXEC_TIMEOUT"), "hccl_buffsize": os.environ.get("HCCL_BUFFSIZE"),
}
# One write() per line: with PYTHONUNBUFFERED=1, print() writes text and newline separately, and under
# `--tee 0` both ranks share one stdout, so their lines could interleave mid-line.
sys.stdout.write("REPORT " + json.dumps(info) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
