"""Run under npurun: train one plan eagerly and then compiled (its ``compile`` section) in one process group,
and write both runs' per-step losses (rank 0) to ``--out`` as JSON.

    npurun --nproc 2 tests/compile/_train_twice.py --config plan.yaml --out losses.json [--section.key VALUE ...]

One launch for both runs halves the process start-up cost in CI; each run builds its model, mesh and optimizer
from scratch, exactly as ``examples/train.py`` does.
"""
import argparse
import json
import os
import sys

import torch.distributed as dist

from npudist.plan import load_plan, parse_overrides
from npudist.train.trainer import _init_distributed, train


def main() -> int:
    overrides, rest = parse_overrides(sys.argv[1:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(rest)
    world = int(os.environ["WORLD_SIZE"])
    compiled = load_plan(args.config, overrides, world_size=world)
    assert compiled.compile.enable, "the plan under test must enable compile"
    eager = load_plan(args.config, [*overrides, "--compile.enable=false"], world_size=world)
    _init_distributed(compiled)
    try:
        result = {"eager": train(eager).losses, "compiled": train(compiled).losses}
    finally:
        dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
