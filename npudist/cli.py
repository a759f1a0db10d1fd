"""The ``npudist`` command (also ``python -m npudist``).

    npudist plan check PLAN.yaml [--world-size N] [--json] [--section.key VALUE ...]
    npudist env        # the CANN environment (export lines), as `source set_env.sh`: eval "$(npudist env)"
"""
from __future__ import annotations

import argparse
import json
import os
import sys

EXIT_INVALID = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npudist", description="npudist tools")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="work with YAML training plans")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True)
    check = plan_sub.add_parser(
        "check", help="validate a plan and show mesh, per-rank shards and memory, without launching",
        description="Validate PLAN for a world size and print the mesh, which rank holds which pipeline "
                    "stage / data-parallel shard / tensor shard, and a per-rank memory estimate. Every "
                    "validation error is reported at once (exit code 2). Extra --section.key VALUE "
                    "arguments override the plan, as in the training script.")
    check.add_argument("plan", help="path of the YAML plan")
    check.add_argument("--world-size", "-n", type=int, default=None,
                       help="number of ranks (default: the product of the plan's degrees; required when "
                            "parallel.dp_shard_degree is -1)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    sub.add_parser("env", help="print the CANN environment (export lines) of npudist's emulated toolkit home",
                   description="Print shell export lines that select npudist's emulated CANN home, the equivalent "
                               "of `source set_env.sh`: eval \"$(npudist env)\". With a real CANN configured "
                               "(ASCEND_HOME_PATH elsewhere) prints nothing and says so on stderr.")
    return parser


def _env() -> int:
    import shlex

    from npudist.cann import environment

    if not environment.is_emulated_home():
        print(f"# ASCEND_HOME_PATH={os.environ.get('ASCEND_HOME_PATH')} selects a CANN toolkit: npudist's emulated "
              "home is not used, nothing to export", file=sys.stderr)
        return 0
    for name, value in environment.emulated_environment().items():
        print(f"export {name}={shlex.quote(value)}")
    lib = os.path.join(environment.LIB64, "libascendcl.so")
    if not os.path.exists(lib):
        print(f"# {lib} is not built yet: scripts/setup.sh (or python -m npudist.cann.build)", file=sys.stderr)
    return 0


def _plan_check(args, extra: list[str]) -> int:
    from npudist.plan import PlanError, parse_overrides
    from npudist.plan.check import capacity_warnings, check_plan, report_dict

    overrides, rest = parse_overrides(extra)
    if rest:
        print(f"npudist plan check: unrecognized arguments: {' '.join(rest)} (plan overrides look like "
              "--parallel.tp_degree 2)", file=sys.stderr)
        return EXIT_INVALID
    try:
        if args.world_size is None:
            from npudist.plan import load_plan
            par = load_plan(args.plan, overrides).parallel
            if par.dp_shard_degree == -1:
                print(f"npudist plan check: {args.plan} sets parallel.dp_shard_degree: -1 (= the rest); pass "
                      "--world-size N", file=sys.stderr)
                return EXIT_INVALID
        plan, degrees, text = check_plan(args.plan, args.world_size, overrides)
        warnings = capacity_warnings(plan, degrees)
    except ValueError as e:   # PlanError, or a malformed NPUDIST_DEVICE_MEMORY
        print(str(e), file=sys.stderr)
        return EXIT_INVALID
    for line in warnings:
        print(line, file=sys.stderr)
    try:
        print(json.dumps(report_dict(plan, degrees), indent=1) if args.json else text, flush=True)
    except BrokenPipeError:   # `npudist plan check ... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "plan" and args.plan_command == "check":
        return _plan_check(args, extra)
    if args.command == "env":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return _env()
    parser.error(f"unknown command {args.command}")
    return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
