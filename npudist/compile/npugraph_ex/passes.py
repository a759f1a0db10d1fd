"""The FX passes of ``npugraph_ex`` over AOTAutograd's aten graphs (docs/graphs.md, "npugraph_ex").

- :func:`reinplace_input_mutations`: AOTAutograd functionalizes an in-place update of a graph input into a functional
  op followed by ``copy_`` back into the input (``add = aten.add(x, 1); aten.copy_(x, add)``). Where that is safe the
  pair becomes the in-place op (``aten.add_(x, 1)``): one kernel writing the input's bytes instead of a kernel, a
  fresh buffer and a copy. torch's reinplace passes skip program inputs (``torch.fx.passes.reinplace`` leaves them as
  a TODO; Inductor's handles only scatter-like ops and ``auto_functionalized``), so this pass handles exactly that
  case and looks the in-place overload up with torch's own helper.
- :func:`remove_noops`: torch Inductor's ``remove_noop_ops`` (views and reshapes to the same shape, clones and copies
  that change nothing, ``cat`` of one input, dtype conversions to the same dtype, ...), with its guards against
  introducing new aliasing between inputs and outputs.

Each returns how many nodes it rewrote; the backend adds the figures to ``counters["npugraph_ex"]``.
"""
from __future__ import annotations

import torch
import torch.fx

_COPY = torch.ops.aten.copy_.default


def _inplace_overload(target):
    from torch.fx.passes.reinplace import _maybe_get_inplace_op

    return _maybe_get_inplace_op(target) if isinstance(target, torch._ops.OpOverload) else None


def _same_layout(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and a.stride() == b.stride())


def _reinplaceable(copy: torch.fx.Node, order: dict) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """``(input, functional node)`` if ``copy_(input, node)`` can become ``node``'s in-place op on ``input``."""
    dst, src = copy.args[0], copy.args[1]
    if not (isinstance(dst, torch.fx.Node) and dst.op == "placeholder" and isinstance(src, torch.fx.Node)):
        return None
    if src.op != "call_function" or not src.args or src.args[0] is not dst or _inplace_overload(src.target) is None:
        return None
    if any(a is dst for a in list(src.args[1:]) + list(src.kwargs.values())):
        return None  # aten.mul_(x, x) reads what it writes
    # The in-place op must produce exactly the bytes the copy_ would write (no broadcast, no dtype promotion).
    if not _same_layout(dst.meta.get("val"), src.meta.get("val")) or order[copy] < order[src]:
        return None
    # Nothing may read the input's old value after the op: every other user runs before it and returns no alias
    # of the input (a view made before the op and read after it would see the new values).
    for user in dst.users:
        if user is src or user is copy:
            continue
        if order[user] > order[src] or _returns_alias(user):
            return None
    return dst, src


def _returns_alias(node: torch.fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return True  # unknown: assume it may alias
    return any(r.alias_info is not None for r in target._schema.returns)


def reinplace_input_mutations(gm: torch.fx.GraphModule) -> int:
    """Turn ``copy_(input, op(input, ...))`` into ``op_(input, ...)`` where safe; returns how many."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    done = 0
    for copy in list(graph.find_nodes(op="call_function", target=_COPY)):
        found = _reinplaceable(copy, order)
        if found is None:
            continue
        dst, src = found
        with graph.inserting_before(src):
            inplace = graph.call_function(_inplace_overload(src.target), src.args, src.kwargs)
        inplace.meta = dict(src.meta)
        # copy_ returns its destination: users of either now use the updated input.
        copy.replace_all_uses_with(inplace)
        src.replace_all_uses_with(inplace)
        graph.erase_node(copy)
        graph.erase_node(src)
        done += 1
    if done:
        graph.lint()
        gm.recompile()
    return done


def remove_noops(gm: torch.fx.GraphModule) -> int:
    """torch Inductor's no-op removal on ``gm``; returns how many nodes it removed."""
    from torch._inductor.fx_passes.post_grad import remove_noop_ops

    before = len(gm.graph.nodes)
    remove_noop_ops(gm.graph)
    removed = before - len(gm.graph.nodes)
    if removed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return removed


def mutated_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the placeholders some node of ``gm`` writes (in-place ops, ``copy_``, ``out=``)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    written = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for arg, value in zip(node.target._schema.arguments, node.args):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.fx.Node):
                written.add(value)
        for name, value in node.kwargs.items():
            arg = next((a for a in node.target._schema.arguments if a.name == name), None)
            if arg is not None and arg.alias_info is not None and arg.alias_info.is_write:
                written.add(value)
    return [i for i, p in enumerate(placeholders) if p in written]
