#!/usr/bin/env python
"""Train the built-in Llama-style model with the parallel layout a YAML plan describes.

    npurun --nproc 4 examples/train.py --config examples/plans/fsdp_tp.yaml
    npurun --nproc 4 examples/train.py --config examples/plans/fsdp_tp.yaml --training.steps 20
    python examples/train.py --config plan.yaml --parallel.dp_shard_degree 1      # one process

Any plan key can be overridden as ``--section.key value``. Exit status: 0 done, 2 invalid plan or
arguments, 3 the loss became NaN/inf. Under npurun an invalid plan is reported once, before any rank starts,
and npurun exits 2 as well.
"""
from __future__ import annotations

import argparse
import os
import sys

from npudist.plan import PlanError, load_plan, parse_overrides
from npudist.train.step import NonFiniteLossError
from npudist.train.trainer import run


def main(argv: list[str] | None = None) -> int:
    overrides, rest = parse_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML plan (see examples/plans/)")
    args = parser.parse_args(rest)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        plan = load_plan(args.config, overrides, world_size=world)
    except (PlanError, OSError) as e:
        # Every rank finds the same problem: the whole report once (npurun normally catches it before any
        # rank starts, see docs/launch.md), a pointer to it from the others.
        rank = int(os.environ.get("RANK", "0"))
        print(f"error: {e}" if rank == 0 else "error: invalid plan or arguments (see rank 0)", file=sys.stderr)
        return 2
    try:
        run(plan)
    except NonFiniteLossError as e:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: training diverged: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
