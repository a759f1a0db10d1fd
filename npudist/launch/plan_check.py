"""Check an npudist plan once, in the launcher, before any rank starts.

A training script that takes ``--config plan.yaml`` (``examples/train.py`` and scripts like it) validates
the plan in every rank; an invalid plan then costs a start of every rank and prints its errors once per
rank. npurun recognises such a job -- the program's arguments hold ``--config PATH`` and PATH is a YAML
mapping with at least one npudist plan section (model, data, parallel, ...) -- and validates the plan for
the job's world size with ``npudist.plan.load_plan``, applying the same ``--section.key value``
overrides the script would. Any other program (no ``--config``, a file that is not a plan) is launched
untouched; ``--no-plan-check`` turns the check off.
"""
from __future__ import annotations

import os

from npudist.plan import Plan, PlanError, load_plan, parse_overrides, parse_yaml
from npudist.plan.check import capacity_warnings


def find_config(script_args: list[str]) -> str | None:
    """The value of ``--config PATH`` / ``--config=PATH`` in a program's arguments, if any."""
    for i, arg in enumerate(script_args):
        if arg == "--config" and i + 1 < len(script_args):
            return script_args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _is_plan(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            data = parse_yaml(f.read(), path)
    except UnicodeDecodeError:
        # A .yaml file that is not UTF-8 is a plan saved in the wrong encoding: load_plan says so once.
        return path.endswith((".yaml", ".yml"))
    except (OSError, PlanError):
        return False   # not readable, or not YAML: the program reports its own config problems
    return any(key in Plan.SECTIONS for key in data)


def check_plan_args(script_args: list[str], world_size: int | None,
                    warnings: list[str] | None = None) -> PlanError | None:
    """The plan's errors for ``world_size`` ranks (None = world-size rules not checked), or None when the
    plan is valid or the program was not given an npudist plan. A valid plan's warnings (its memory estimate
    beyond a device's capacity) are appended to ``warnings``."""
    path = find_config(script_args)
    if path is None or not os.path.isfile(path) or not _is_plan(path):
        return None
    overrides, _ = parse_overrides(script_args)
    try:
        plan = load_plan(path, overrides, world_size=world_size)
    except PlanError as e:
        return e
    if warnings is not None and world_size is not None:
        warnings.extend(capacity_warnings(plan, plan.parallel.degrees()))
    return None


def format_plan_error(err: PlanError, world_size: int | None) -> str:
    """One report for the whole job (what each rank would have printed), naming how to skip the check."""
    ranks = f" for {world_size} ranks" if world_size else ""
    n = len(err.errors)
    head = (f"invalid plan {err.source}{ranks}: {n} error{'s' if n != 1 else ''} (checked by npurun before "
            "starting any rank; --no-plan-check launches without this check)")
    return head + "".join(f"\n  {e}" for e in err.errors)
