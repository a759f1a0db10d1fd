"""Super-kernel scopes (torch_npu's ``super_kernel_scope_begin`` / ``super_kernel_scope_end``).

During an NPUGraph capture, the kernels the capturing stream records between ``super_kernel_scope_begin(name)`` and
the matching ``super_kernel_scope_end(name)`` form a scope; after the capture, ``NPUGraph.super_kernel_optimize()``
fuses each scope's kernels into one task, one launch at replay (docs/graphs.md, "Super kernels"). Outside a capture
the calls only check their argument. Both are the ``npu::`` library ops ``torch.ops.npu.super_kernel_scope_begin`` /
``_end`` (torch_npu's schemas), with fake kernels and marked side-effectful, so ``torch.compile`` keeps them in the
graph in their place.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.fx.node import has_side_effect

from npudist import _C


def _check_name(scope_name: Optional[str]) -> None:
    if scope_name is not None and not scope_name.strip():
        raise RuntimeError("scope_name should be None or a non-empty string.")


def _scope_begin_impl(scope_name: Optional[str] = None) -> None:
    _check_name(scope_name)
    _C._super_kernel_scope(True, scope_name)


def _scope_end_impl(scope_name: Optional[str] = None) -> None:
    _check_name(scope_name)
    _C._super_kernel_scope(False, scope_name)


_lib = torch.library.Library("npu", "FRAGMENT")
for _name, _impl in (("super_kernel_scope_begin", _scope_begin_impl), ("super_kernel_scope_end", _scope_end_impl)):
    _lib.define(f"{_name}(str? scope_name=None) -> ()")
    # No tensor argument: BackendSelect (always in the dispatch key set) answers plain calls; the backend keys
    # answer calls that carry one in their key set.
    for _key in ("PrivateUse1", "BackendSelect", "CPU"):
        _lib.impl(_name, _impl, _key)
    _op = getattr(torch.ops.npu, _name).default
    # Dead-code elimination would drop a call that returns nothing; the mark is its effect.
    has_side_effect(_op)
    torch.library.register_fake(f"npu::{_name}", lambda scope_name=None: None, lib=_lib)


def super_kernel_scope_begin(scope_name: Optional[str] = None) -> None:
    """Begin a super-kernel scope on the current stream (a mark in the capture it records, if any)."""
    return torch.ops.npu.super_kernel_scope_begin(scope_name)


def super_kernel_scope_end(scope_name: Optional[str] = None) -> None:
    """End the scope begun with the same ``scope_name`` (None pairs with None)."""
    return torch.ops.npu.super_kernel_scope_end(scope_name)


# NPUGraph.super_kernel_optimize's option names and types (torch_npu's _validate_options).
_INT, _STR, _STRS = {"value_type": int}, {"value_type": str}, {"value_type": list, "element_type": str}
VALID_OPTIONS = {
    "optimize_options": {
        "preload_code": _INT, "split_mode": _INT, "stream_fusion": _INT, "constant_codegen": _INT,
        "auto_op_parallel": _INT, "opt_extend": _STR, "dcci_before_kernel_start": _STRS,
        "dcci_after_kernel_end": _STRS, "dcci_disable_on_kernel": _STRS,
        "aggressive_opt_strategies": {"value_type": dict, "sub_options": {
            "event_breaker_bypass": _INT, "value_breaker_bypass": _INT, "task_breaker_bypass": _INT}},
        "ubuf_lock_ignore_kernel": _STRS, "early_start": _INT,
    },
    "debug_options": {
        "debug_sync_all": _INT, "debug_op_exec_trace": _INT, "debug_cross_core_sync_check": _INT,
        "debug_extend": _STR, "debug_per_op_max_core_num": _INT,
    },
}


def validate_options(option_name: str, options) -> None:
    """Raise RuntimeError, as torch_npu does, for an option dict with an unknown key or a value of the wrong type."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise RuntimeError(f"{option_name} param must be dict or None.")
    valid = VALID_OPTIONS.get(option_name)
    for key, value in options.items():
        if valid is None:
            raise RuntimeError(f"Invalid {option_name} param.")
        if key not in valid:
            raise RuntimeError(f"Invalid {option_name} param key: '{key}'.")
        expected = valid[key]["value_type"]
        if not isinstance(value, expected):
            raise RuntimeError(f"{option_name} param['{key}'] must be {expected.__name__}, got {type(value).__name__}")
        for sub_key, sub_value in (value.items() if "sub_options" in valid[key] else ()):
            if sub_key not in valid[key]["sub_options"]:
                raise RuntimeError(f"Invalid sub_key '{sub_key}' in {option_name}['{key}'].")
            sub_expected = valid[key]["sub_options"][sub_key]["value_type"]
            if not isinstance(sub_value, sub_expected):
                raise RuntimeError(f"{option_name}['{key}']['{sub_key}'] must be {sub_expected.__name__}, "
                                   f"got {type(sub_value).__name__}")
        for i, elem in enumerate(value if "element_type" in valid[key] else ()):
            if not isinstance(elem, valid[key]["element_type"]):
                raise RuntimeError(f"{option_name}['{key}'][{i}] must be {valid[key]['element_type'].__name__}, "
                                   f"got {type(elem).__name__}")


__all__ = ["super_kernel_scope_begin", "super_kernel_scope_end"]
