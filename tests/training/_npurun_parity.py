"""One rank of a parity run under npurun: ``npurun --nproc N _npurun_parity.py PLAN.yaml OUT`` trains the plan
file through npudist.parallelize + train_step (as ``_train_parity.parallel_worker`` does under spawn) and
saves this rank's losses, gradient norms and final parameters to ``OUT.<rank>``."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _train_parity import train_and_save  # noqa: E402
from npudist.plan import load_plan  # noqa: E402


def main(plan_path: str, out_path: str) -> None:
    plan = load_plan(plan_path, world_size=int(os.environ["WORLD_SIZE"]))
    if plan.training.device == "npu":
        import npudist
        npudist.register()   # a no-op after `import torch` autoloaded it; needed with autoload off
        torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(plan.training.resolved_backend)
    try:
        train_and_save(plan, f"{out_path}.{dist.get_rank()}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
