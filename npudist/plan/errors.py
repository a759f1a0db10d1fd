"""The one exception a bad plan raises: every problem found, one line each, naming its key path."""
from __future__ import annotations

import difflib
from typing import Iterable


class PlanError(ValueError):
    """A plan failed to parse or validate. ``errors`` holds one ``"key.path: problem"`` line per problem."""

    def __init__(self, errors: Iterable[str], source: str | None = None):
        self.errors = list(errors)
        self.source = source
        where = f" {source}" if source else ""
        n = len(self.errors)
        head = f"invalid plan{where}: {n} error{'s' if n != 1 else ''}"
        super().__init__(head + "".join(f"\n  {e}" for e in self.errors))


def suggest(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean "x"?)' for the closest candidate, or '' when nothing is close."""
    candidates = [str(c) for c in candidates]
    folded = [c for c in candidates if c.lower() == str(name).lower()]
    match = folded or difflib.get_close_matches(str(name), candidates, n=1, cutoff=0.6)
    if not match and len(str(name)) >= 2:   # abbreviations: "zbv" -> "ZBVZeroBubble"
        match = [c for c in candidates if c.lower().startswith(str(name).lower())][:1]
    return f' (did you mean "{match[0]}"?)' if match else ""
