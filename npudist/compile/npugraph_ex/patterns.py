"""User pattern replacement for ``npugraph_ex``: ``register_replacement`` over torch Inductor's pattern matcher.

Patterns are traced from ``search_fn`` (with ``trace_fn``, ``fwd_only`` by default) into aten graphs and matched
structurally against each graph the backend compiles (``PatternMatcherPass``); a match whose ``extra_check``
accepts it is replaced by the trace of ``replace_fn`` on the matched values. Registered patterns apply to graphs
compiled afterwards (Dynamo's cache keeps graphs already compiled: ``torch._dynamo.reset()`` recompiles them).
Both functions are traced without Inductor's decompositions, as the graphs are.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch.fx

_pass = None


def _pattern_pass():
    global _pass
    if _pass is None:
        from torch._inductor.pattern_matcher import PatternMatcherPass

        _pass = PatternMatcherPass(pass_name="npugraph_ex_user_patterns")
    return _pass


def _return_true(match) -> bool:
    return True


def register_replacement(search_fn: Callable, replace_fn: Callable, example_inputs: Iterable[Any],
                         trace_fn: Callable | None = None, extra_check: Callable = _return_true,
                         search_fn_pattern=None, scalar_workaround: dict | None = None,
                         skip_duplicates: bool = False) -> bool:
    """Replace every match of ``search_fn``'s graph by ``replace_fn``'s in graphs ``npugraph_ex`` compiles.

    Same arguments and meaning as torch_npu's ``torch.npu.npugraph_ex.register_replacement`` (which are
    ``torch._inductor.pattern_matcher.register_replacement``'s); returns whether the pattern was registered.
    """
    from torch._inductor.pattern_matcher import fwd_only
    from torch._inductor.pattern_matcher import register_replacement as register

    if not callable(search_fn) or not callable(replace_fn):
        raise TypeError("register_replacement: search_fn and replace_fn must be callables tracing to aten ops")
    example_inputs = list(example_inputs)
    if not example_inputs:
        raise ValueError("register_replacement: example_inputs is empty; pass one example value per argument of "
                         "search_fn (tensors of a representative dtype and rank)")
    return register(search_fn, replace_fn, example_inputs, trace_fn or fwd_only, _pattern_pass(),
                    extra_check=extra_check, scalar_workaround=scalar_workaround,
                    search_fn_pattern=search_fn_pattern, skip_duplicates=skip_duplicates,
                    get_decomp_fn=_no_decompositions)


def _no_decompositions() -> dict:
    # The graphs npugraph_ex compiles are AOTAutograd's without Inductor's decompositions (silu stays silu), so
    # search and replacement are traced the same way: with Inductor's table, x * sigmoid(x) would be replaced by
    # silu's decomposition and a search for silu would never match.
    return {}


def apply_patterns(gm: torch.fx.GraphModule) -> int:
    """Apply the registered replacements to ``gm``; returns how many matches were replaced."""
    if _pass is None or not _pass.patterns:
        return 0
    count = _pass.apply(gm.graph)
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count
