"""The registration step torch's autoload defers while ``npudist.device`` is being imported (``npudist._autoload``):
the device package runs it as its last step. It lives here, below both, so that neither imports the other."""
from __future__ import annotations

from typing import Callable

_pending: Callable[[], None] | None = None


def defer(step: Callable[[], None]) -> None:
    global _pending
    _pending = step


def run_pending() -> None:
    global _pending
    step, _pending = _pending, None
    if step is not None:
        step()
