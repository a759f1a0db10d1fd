"""Module-name patterns used by plans (FSDP ``wrap``, TP ``plan``).

A pattern is matched against a fully qualified module name from ``model.named_modules()``, segment by
segment (segments are separated by "."): ``*`` matches exactly one segment (``layers.*`` is every block but
not ``layers.0.attention``), ``**`` matches any number of segments (``**.wq`` is every ``wq``), and a segment
may contain fnmatch wildcards (``w[13]``, ``layers.1*``). Segment-wise matching is why a pattern never
silently reaches into sub-modules, unlike plain fnmatch where ``*`` also crosses dots.
"""
from __future__ import annotations

import fnmatch
from typing import Iterable, Iterator


def _match_segments(pat: list[str], name: list[str]) -> bool:
    if not pat:
        return not name
    head, rest = pat[0], pat[1:]
    if head == "**":
        return any(_match_segments(rest, name[i:]) for i in range(len(name) + 1))
    return bool(name) and fnmatch.fnmatchcase(name[0], head) and _match_segments(rest, name[1:])


def matches(pattern: str, name: str) -> bool:
    """True if module name ``name`` matches ``pattern`` (segment-wise, see module docstring)."""
    return _match_segments(pattern.split("."), name.split(".") if name else [])


def check_pattern(pattern: str) -> str | None:
    """Problem with a pattern's syntax, or None if it is usable."""
    if not isinstance(pattern, str) or not pattern.strip():
        return "empty module-name pattern"
    if any(seg == "" for seg in pattern.split(".")):
        return f'pattern "{pattern}" has an empty segment (".." or a leading/trailing ".")'
    return None


def select_names(patterns: Iterable[str], names: Iterable[str]) -> Iterator[str]:
    """Names matching any of ``patterns``, in the order of ``names``."""
    pats = list(patterns)
    for name in names:
        if any(matches(p, name) for p in pats):
            yield name
