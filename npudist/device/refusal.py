"""Names of torch_npu whose meaning needs Ascend hardware the emulated device does not have.

Each such name exists with torch_npu's signature and raises :class:`NeedsAscendHardware` naming itself and the
missing hardware, so code written for Ascend fails at that call with the reason, not with an AttributeError
(or, worse, a made-up answer). ``refuses(why)`` marks a function so: the surface table in docs/torch_npu_surface.md
reads the reason from ``__npudist_refused__``.
"""
from __future__ import annotations

import functools
from typing import Callable


class NeedsAscendHardware(RuntimeError):
    """Raised by a torch_npu name whose meaning needs hardware that the emulated npu device lacks."""


def refuses(why: str) -> Callable[[Callable], Callable]:
    """Make the decorated function (whose body is never run) raise NeedsAscendHardware with ``why``."""

    def wrap(fn: Callable) -> Callable:
        name = f"torch.npu.{fn.__name__}" if fn.__module__.startswith("npudist.device") else fn.__qualname__

        @functools.wraps(fn)
        def refuse(*args, **kwargs):
            raise NeedsAscendHardware(f"{name}: {why}; the emulated npu device has no such hardware "
                                      "(docs/torch_npu.md)")

        refuse.__npudist_refused__ = why
        return refuse

    return wrap
