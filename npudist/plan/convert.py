"""Typed conversion of plain YAML data into the plan dataclasses, driven by their annotations.

Every problem is appended to ``errors`` as ``"key.path: problem"`` instead of raising, so a plan with
several mistakes reports all of them at once.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, Union

from .errors import suggest

INVALID = object()   # conversion failed; the error is already recorded


@functools.lru_cache(maxsize=None)
def field_types(cls) -> dict[str, Any]:
    """Resolved annotations of a dataclass's init fields."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def describe(tp) -> str:
    """Human name of a type annotation for error messages."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else describe(a) for a in args)
    if origin is list:
        return f"a list of {describe(args[0])}"
    if origin is tuple:
        return f"a list of {len(args)} numbers" if args else "a list"
    if origin is dict:
        return f"a mapping of {describe(args[0])} to {describe(args[1])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _convert_scalar(value, tp):
    if tp is bool:
        return value if isinstance(value, bool) else INVALID
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else INVALID
    if tp is float:
        if isinstance(value, str):   # YAML 1.1 reads "1e-3" (no dot) as a string: accept it as a number
            try:
                value = float(value)
            except ValueError:
                return INVALID
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # .nan/.inf are YAML floats, but no plan setting means anything with them (an lr of nan or inf
            # would only fail, or train garbage, steps later)
            return float(value) if math.isfinite(value) else INVALID
        return INVALID
    if tp is str:
        return value if isinstance(value, str) else INVALID
    raise TypeError(f"unsupported schema type {tp!r}")


def convert(value, tp, path: str, errors: list[str]):
    """``value`` converted to annotation ``tp``; INVALID (with an error recorded) if it does not fit."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return convert_dataclass(value, tp, path, errors)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            trial: list[str] = []
            out = convert(value, arg, path, trial)
            if out is not INVALID and not trial:
                return out
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:   # Optional[X]: report X's own (more specific) error
            out = convert(value, members[0], path, errors)
            return INVALID if out is None else out
        errors.append(f"{path}: expected {describe(tp)}, got {_show(value)}")
        return INVALID
    if origin is Literal:
        if value in args and type(value) is type(args[args.index(value)]):
            return value
        hint = suggest(value, [str(a) for a in args]) if isinstance(value, str) else ""
        errors.append(f"{path}: expected {describe(tp)}, got {_show(value)}{hint}")
        return INVALID
    if origin is list:
        if not isinstance(value, (list, tuple)):
            errors.append(f"{path}: expected {describe(tp)}, got {_show(value)}")
            return INVALID
        out = [convert(v, args[0], f"{path}[{i}]", errors) for i, v in enumerate(value)]
        return INVALID if any(v is INVALID for v in out) else out
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            errors.append(f"{path}: expected {describe(tp)}, got {_show(value)}")
            return INVALID
        out = [convert(v, a, f"{path}[{i}]", errors) for i, (v, a) in enumerate(zip(value, args))]
        return INVALID if any(v is INVALID for v in out) else tuple(out)
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected {describe(tp)}, got {_show(value)}")
            return INVALID
        out = {}
        for k, v in value.items():
            key = convert(k, args[0], f"{path}.<key {k!r}>", errors)
            val = convert(v, args[1], f"{path}.{k}", errors)
            if key is not INVALID and val is not INVALID:
                out[key] = val
        return out if len(out) == len(value) else INVALID
    out = _convert_scalar(value, tp)
    if out is INVALID:
        errors.append(f"{path}: expected {describe(tp)}, got {_show(value)}")
    return out


def convert_dataclass(value, cls, path: str, errors: list[str], bad_paths: set[str] | None = None,
                      field_classes: dict[str, type] | None = None):
    """Instance of ``cls`` from a mapping; fields that fail keep their defaults (and are recorded in
    ``bad_paths`` so cross-field validation can skip rules built on them). ``field_classes`` replaces the
    dataclass of some fields (the ``model`` section's class depends on the model spec it names)."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        errors.append(f"{path or 'plan'}: expected a mapping of {cls.__name__} fields, got {_show(value)}")
        if bad_paths is not None:
            bad_paths.add(path)
        return cls()
    types_ = {**field_types(cls), **(field_classes or {})}
    kwargs = {key: sub_cls() for key, sub_cls in (field_classes or {}).items() if key not in value}
    for key, raw in value.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in types_:
            errors.append(f"{sub}: unknown key{suggest(key, types_)}; known keys: {', '.join(types_)}")
            continue
        if dataclasses.is_dataclass(types_[key]):
            out = convert_dataclass(raw, types_[key], sub, errors, bad_paths)
        else:
            before = len(errors)
            out = convert(raw, types_[key], sub, errors)
            if out is INVALID or len(errors) > before:
                if bad_paths is not None:
                    bad_paths.add(sub)
                continue
        kwargs[key] = out
    return cls(**kwargs)
