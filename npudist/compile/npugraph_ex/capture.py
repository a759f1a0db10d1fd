"""NPUGraph capture for ``npugraph_ex``: npugraphs' capture per input signature, counted, split at collectives.

A compiled graph runs through :class:`npudist.compile.npugraphs.NpuGraphed` (capture on first use per input
signature, static inputs used in place, others copied in, outputs copied out). :class:`CountedGraph` adds the
counters and the inputs the graph writes: those are static, so a replay writes into the caller's tensor as eager
does, and a call with another tensor in that position is a new capture (counted as an input-mutation recapture).

hccl collectives cannot be recorded by a capture (docs/graphs.md, "Refused: work capture cannot record"). A graph
that contains ``_c10d_functional`` / ``c10d`` ops is therefore split (torch.fx ``split_module``) into pieces: each
run of compute ops between collectives is captured and replayed, and each collective (with its ``wait_tensor``) runs
eagerly on hccl between them, with the values the pieces produced.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx
from torch._dynamo.utils import counters

from npudist.compile.npugraphs import NpuGraphed, _Captured

COUNTERS = "npugraph_ex"
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d", "c10d_functional", "_dtensor")


def _differs_only_at(a: tuple, b: tuple, positions) -> bool:
    return len(a) == len(b) and all(x == y or i in positions for i, (x, y) in enumerate(zip(a, b)))


# Queued copies on the current stream, ordered with the replays queued there: the host does not wait for an
# earlier replay to finish (npugraphs' one-call copies drain the stream first).
def _copy_inputs(statics: list, values: list) -> None:
    for static, value in zip(statics, values):
        static.copy_(value)


def _clone_outputs(outputs: list) -> list:
    return [o.clone() if isinstance(o, torch.Tensor) else o for o in outputs]


class CountedGraph(NpuGraphed):
    """npugraphs' capture with ``counters["npugraph_ex"]`` and the graph's written inputs used in place; inputs
    and outputs are copied by queued copies."""

    copy_in = staticmethod(_copy_inputs)
    copy_out = staticmethod(_clone_outputs)

    def __init__(self, run: Callable, static_idx, mutated_idx):
        super().__init__(run, set(static_idx) | set(mutated_idx))
        self.mutated_idx = frozenset(mutated_idx)

    def note_call(self, key: tuple, replay) -> None:
        if replay is not None:
            # A graph that could not be captured runs eagerly (npugraphs warned once, naming why).
            counters[COUNTERS]["replays" if isinstance(replay, _Captured) else "eager_runs"] += 1
        elif not self.captured:
            counters[COUNTERS]["captures"] += 1
        elif any(_differs_only_at(key, k, self.mutated_idx) for k in self.captured):
            counters[COUNTERS]["recaptures_input_mutation"] += 1
        else:
            counters[COUNTERS]["recaptures_shape"] += 1


def is_collective(node: torch.fx.Node) -> bool:
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and target.namespace in _COLLECTIVE_NAMESPACES)


class _Piece:
    """One captured piece of a split graph, called as ``split_module`` calls its submodules (unboxed)."""

    def __init__(self, graphed: CountedGraph, single: bool):
        self.graphed = graphed
        self.single = single

    def __call__(self, *args):
        out = self.graphed(list(args))
        return out[0] if self.single else tuple(out)


def _unboxed_run(module: torch.fx.GraphModule, single: bool):
    def run(args: list):
        out = module(*args)
        args.clear()
        return [out] if single else list(out)
    return run


def _split_at_collectives(gm: torch.fx.GraphModule, static_idx, mutated_idx) -> torch.fx.GraphModule:
    """``gm`` split into captured pieces and eager collectives (the module docstring)."""
    from torch.fx.passes.split_module import split_module

    part, parts = 0, {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if is_collective(node):
            part += 1
            parts[node] = part
            part += 1
        else:
            parts[node] = part
    collective_parts = {p for n, p in parts.items() if is_collective(n)}
    split = split_module(gm, None, lambda n: parts[n], keep_original_order=True)
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    static_names = {placeholders[i].name for i in static_idx}
    mutated_names = {placeholders[i].name for i in mutated_idx}
    for node in split.graph.find_nodes(op="call_module"):
        index = int(node.target.rsplit("_", 1)[1])
        if index in collective_parts:
            counters[COUNTERS]["eager_collective_pieces"] += 1
            continue
        sub = getattr(split, node.target)
        out = next(iter(sub.graph.find_nodes(op="output"))).args[0]
        single = not isinstance(out, (tuple, list))
        names = [a.name if isinstance(a, torch.fx.Node) else None for a in node.args]
        graphed = CountedGraph(_unboxed_run(sub, single),
                               [i for i, n in enumerate(names) if n in static_names],
                               [i for i, n in enumerate(names) if n in mutated_names])
        delattr(split, node.target)  # a plain attribute: the split module's code calls self.<name>(...)
        setattr(split, node.target, _Piece(graphed, single))
        counters[COUNTERS]["captured_pieces"] += 1
    return split


def capture_graph(gm: torch.fx.GraphModule, static_idx, mutated_idx):
    """A boxed callable replaying ``gm`` as NPUGraphs (split at collectives when it has any)."""
    from torch._dynamo.backends.debugging import boxed_nop

    if not any(is_collective(n) for n in gm.graph.nodes):
        return CountedGraph(boxed_nop(gm, None), static_idx, mutated_idx)
    split = _split_at_collectives(gm, static_idx, mutated_idx)

    def run(args: list):
        out = split(*args)
        args.clear()
        return out

    run._boxed_call = True
    return run
