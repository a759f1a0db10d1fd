#!/usr/bin/env python
"""Train the built-in Llama-style model with the parallel layout a YAML plan describes.

    npurun --nproc 4 examples/train.py --config examples/plans/fsdp_tp.yaml
    npurun --nproc 4 examples/train.py --config examples/plans/fsdp_tp.yaml --training.steps 20
    python examples/train.py --config plan.yaml --parallel.dp_shard_degree 1      # one process

Any plan key can be overridden as ``--section.key value``. Exit status: 0 done; 2 a user error, reported as a
message: an invalid plan or argument, a malformed environment variable, a checkpoint folder that cannot be used,
a checkpoint that cannot be resumed, more device memory than the devices have; 3 the loss became NaN/inf.
``--verbose`` adds the traceback to the message. Under npurun an invalid plan is reported once, before any rank
starts, and npurun exits 2 as well.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch

from npudist.plan import load_plan, parse_overrides
from npudist.train.step import NonFiniteLossError
from npudist.train.trainer import run

EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; it is set by the launcher (npurun, torchrun): "
                         "unset it to run one process") from None


def report(e: BaseException, rank: int, verbose: bool, prefix: str = "error") -> None:
    """The error once in full (rank 0), its first line on the other ranks: every rank finds the same problem
    in the plan, but any of them may be the first to exit, and the launcher's summary quotes that one."""
    # notes (BaseException.add_note) are part of the report: an out-of-memory error carries the plan's levers there
    lines = (str(e).splitlines() or [type(e).__name__]) + [n for note in getattr(e, "__notes__", ()) for n in
                                                             str(note).splitlines()]
    if rank == 0:
        text = "\n".join(lines)
    else:
        text = lines[0] + (" (the whole report: rank 0)" if len(lines) > 1 else "")
    print(f"{prefix}: {text}", file=sys.stderr, flush=True)
    if verbose:
        traceback.print_exception(e, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    overrides, rest = parse_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML plan (see examples/plans/)")
    parser.add_argument("--verbose", action="store_true", help="print the traceback of an error, not only its message")
    args = parser.parse_args(rest)
    rank = 0
    try:
        rank = _env_int("RANK", 0)
        plan = load_plan(args.config, overrides, world_size=_env_int("WORLD_SIZE", 1))
        run(plan)
    except NonFiniteLossError as e:
        report(e, rank, args.verbose, "error: training diverged")
        return EXIT_DIVERGED
    except (ValueError, OSError) as e:
        # PlanError, CheckpointError and npudist.env.EnvVarError are ValueErrors; OSError: a folder or file the
        # plan names that cannot be read or written.
        report(e, rank, args.verbose)
        return EXIT_USER_ERROR
    except torch.OutOfMemoryError as e:   # the plan needs more than the device has; the message names the levers
        report(e, rank, args.verbose, "error: out of device memory")
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
