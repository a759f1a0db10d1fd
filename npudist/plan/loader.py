"""Load a plan: YAML file (or dict) + command-line overrides -> validated ``Plan``.

Nothing here touches torch.distributed: a plan is fully checked before any process group exists.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import typing
from typing import Any, Iterable, Sequence

import yaml

from npudist.models import get_model_spec

from .convert import convert_dataclass, field_types
from .errors import PlanError, suggest
from .schema import ModelConfig, Plan
from .validate import resolve_plan, validate_plan


def model_config_class(data: dict) -> type:
    """The dataclass of the ``model`` section: the config class of the model spec it names
    (``ModelSpec.config_cls``, for a spec with fields of its own), ``ModelConfig`` for the others and for an
    unknown name (reported by validation)."""
    section = data.get("model")
    name = section.get("name", ModelConfig.name) if isinstance(section, dict) else ModelConfig.name
    try:
        return get_model_spec(name).config_cls or ModelConfig
    except (ValueError, TypeError):
        return ModelConfig


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node, deep=False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f'duplicate key "{key}" (first defined on line {seen[key]})', key_node.start_mark)
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str = "<string>") -> dict:
    """Plain data of a YAML plan; PlanError with the line and column on a syntax error."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise PlanError([f"{source}: invalid YAML at {where}: {problem}"], source) from None
    except yaml.YAMLError as e:
        raise PlanError([f"{source}: invalid YAML: {e}"], source) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PlanError([f"{source}: a plan must be a mapping of sections ({', '.join(Plan.SECTIONS)}), "
                         f"got {type(data).__name__}"], source)
    return data


def _split_override(item: str) -> tuple[str, str | None]:
    body = item[2:] if item.startswith("--") else item
    if "=" in body:
        key, value = body.split("=", 1)
        return key, value
    return body, None


def normalize_overrides(overrides: Iterable[str]) -> list[tuple[str, str]]:
    """[(key.path, raw value)] from ``["--a.b", "2", "--c.d=3", "e.f=4"]``; PlanError if a value is missing."""
    items = list(overrides)
    out, errors, i = [], [], 0
    while i < len(items):
        key, value = _split_override(items[i])
        if value is None:
            if i + 1 < len(items) and not (items[i + 1].startswith("--") and "." in items[i + 1]):
                value = items[i + 1]
                i += 1
            else:
                errors.append(f"{key}: override has no value (use --{key} VALUE or --{key}=VALUE)")
        if value is not None:
            out.append((key, value))
        i += 1
    if errors:
        raise PlanError(errors, "overrides")
    return out


def _parse_value(raw: str):
    """YAML scalar/flow value of an override ("2" -> 2, "null" -> None, "[1, 2]" -> list)."""
    try:
        return yaml.load(raw, Loader=_StrictLoader)
    except yaml.YAMLError:
        return raw


def apply_override(data: dict, key: str, raw: str, errors: list[str]) -> None:
    """Set ``key`` (a dotted path through the schema) in plain plan data. A mapping-typed field (like
    ``parallel.tp.plan``) takes the rest of the path as one key, since module patterns contain dots."""
    parts = key.split(".")
    cls, node = Plan, data
    for i, part in enumerate(parts):
        types_ = {**field_types(cls), "model": model_config_class(data)} if cls is Plan else field_types(cls)
        path = ".".join(parts[: i + 1])
        if part not in types_:
            errors.append(f"{path}: unknown key in override --{key}{suggest(part, types_)}")
            return
        tp = types_[part]
        last = i == len(parts) - 1
        if last:
            node[part] = _parse_value(raw)
            return
        if dataclasses.is_dataclass(tp):
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            cls, node = tp, child
            continue
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) is dict or any(typing.get_origin(a) is dict for a in inner):
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            child[".".join(parts[i + 1:])] = _parse_value(raw)
            return
        errors.append(f"{path}: is not a section; override it as --{path} VALUE")
        return


def parse_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split a script's argv into plan overrides (``--section.key value`` / ``--section.key=value`` where
    section is a plan section) and the remaining arguments, which are returned untouched."""
    overrides, rest, i = [], [], 0
    argv = list(argv)
    while i < len(argv):
        arg = argv[i]
        key = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        if "." in key and key.split(".", 1)[0] in Plan.SECTIONS:
            if "=" in arg:
                overrides.append(arg)
            elif i + 1 < len(argv):
                overrides.append(f"{arg}={argv[i + 1]}")
                i += 1
            else:
                overrides.append(arg)   # load_plan reports the missing value
        else:
            rest.append(arg)
        i += 1
    return overrides, rest


def load_plan(path_or_dict, overrides: Iterable[str] = (), world_size: int | None = None) -> Plan:
    """Parse, override and validate a plan. With ``world_size``, ``parallel.dp_shard_degree`` = -1 is filled
    in and every world-size dependent rule is checked. Raises PlanError (a ValueError) listing all problems."""
    if isinstance(path_or_dict, Plan):
        data, source = dataclasses.asdict(path_or_dict), "<Plan>"
    elif isinstance(path_or_dict, dict):
        data, source = copy.deepcopy(path_or_dict), "<dict>"
    elif isinstance(path_or_dict, (str, os.PathLike)):
        source = os.fspath(path_or_dict)
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise PlanError([f"{source}: cannot read plan file: {e.strerror or e}"], source) from None
        except UnicodeDecodeError as e:
            raise PlanError([f"{source}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); a plan "
                             "is a YAML file in UTF-8: save it as UTF-8 or give the right file"], source) from None
        data = parse_yaml(text, source)
    else:
        raise TypeError(f"load_plan expects a path, a dict or a Plan, got {type(path_or_dict).__name__}")

    errors: list[str] = []
    # model.name first: it decides which keys the rest of the model section has.
    pairs = sorted(normalize_overrides(overrides), key=lambda kv: kv[0] != "model.name")
    for key, raw in pairs:
        apply_override(data, key, raw, errors)
    bad: set[str] = set()
    plan = convert_dataclass(data, Plan, "", errors, bad, field_classes={"model": model_config_class(data)})
    errors += validate_plan(plan, world_size, skip=bad)
    if errors:
        raise PlanError(errors, source)
    resolve_plan(plan, world_size)
    return plan
