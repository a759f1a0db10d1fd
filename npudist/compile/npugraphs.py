"""``torch.compile(backend="npugraphs")``: AOTAutograd graphs replayed as NPUGraphs (docs/graphs.md).

Like PyTorch's ``"cudagraphs"`` backend, the forward and backward graphs that AOTAutograd produces run their aten
ops eagerly once under capture and are replayed afterwards. Each compiled graph keeps one NPUGraph per input
signature (shapes, strides, dtypes, devices, non-tensor values and the addresses of parameters/buffers, which are
used in place). Other inputs are copied into static buffers before each replay; outputs are returned as fresh
copies, so results a caller keeps are never overwritten by a later replay. A graph that cannot be captured
(an op that is not permitted during capture, e.g. a host read) runs without NPUGraph, with a warning naming why,
as torch's cudagraphs backend skips such graphs.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch

from npudist import _C


def _signature(args: list, static_idx: frozenset) -> tuple:
    key = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            key.append((tuple(a.shape), a.stride(), a.dtype, a.device, a.data_ptr() if i in static_idx else None))
        else:
            key.append((type(a), a))
    return tuple(key)


class _Captured:
    """One NPUGraph of a compiled graph over static inputs, for one input signature."""

    def __init__(self, graph, static_inputs: list, copied_idx: list[int], outputs, copy_in: Callable,
                 copy_out: Callable):
        self.graph = graph
        self.copy_in = copy_in
        self.copy_out = copy_out
        self.copied_idx = copied_idx
        self.copied_statics = [static_inputs[i] for i in copied_idx]
        self.outputs = outputs

    def __call__(self, args: list):
        self.copy_in(self.copied_statics, [args[i] for i in self.copied_idx])
        args.clear()
        self.graph.replay()
        return self.copy_out(self.outputs)


def _fresh(outputs: list) -> list:
    """Copies of the tensor outputs (one C++ call), other outputs as they are."""
    idx = [i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor)]
    fresh = list(outputs)
    for i, t in zip(idx, _C._graph_copy_out([outputs[i] for i in idx])):
        fresh[i] = t
    return fresh


class NpuGraphed:
    """A boxed compiled graph (AOTAutograd's calling convention) that captures on first use per signature."""

    # How inputs reach the static buffers and outputs are returned: one C++ call each, which first waits for the
    # stream's queued work (an earlier replay still reading the static inputs or writing the outputs).
    copy_in = staticmethod(_C._graph_copy_into_static)
    copy_out = staticmethod(_fresh)

    def __init__(self, run: Callable, static_idx):
        # In the instance dict: AOTAutograd wraps the backward in torch._dynamo.disable, which copies it.
        self._boxed_call = True
        self.run = run
        self.static_idx = frozenset(static_idx)
        self.captured: dict[tuple, Callable] = {}

    def __call__(self, args: list):
        key = _signature(args, self.static_idx)
        replay = self.captured.get(key)
        self.note_call(key, replay)
        if replay is not None:
            return replay(args)
        outputs, replay = self._capture(args)
        self.captured[key] = replay
        return outputs

    def note_call(self, key: tuple, replay: Callable | None) -> None:
        """Called with each call's signature and what it will run (None: a new capture); for subclasses."""

    def _capture(self, args: list):
        copied = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in self.static_idx]
        static_inputs = list(args)
        for i in copied:
            static_inputs[i] = torch.empty_like(args[i])  # dense (an expanded input gets its own bytes)
        self.copy_in([static_inputs[i] for i in copied], [args[i] for i in copied])
        g = torch.npu.NPUGraph()
        try:
            with torch.npu.graph(g):
                outputs = self.run(list(static_inputs))
        except RuntimeError as e:
            warnings.warn(f"npugraphs: running this compiled graph without NPUGraph: {e}", stacklevel=2)
            eager = functools.partial(_run_eagerly, self.run)
            return eager(args), eager
        args.clear()
        # The capture ran the graph once: its outputs are this call's results.
        return self.copy_out(outputs), _Captured(g, static_inputs, copied, outputs, self.copy_in, self.copy_out)


def _run_eagerly(run: Callable, args: list):
    return run(args)


def npugraphs(model: torch.fx.GraphModule, example_inputs: list[Any]):
    """The Dynamo backend: AOTAutograd with NPUGraph replay of the forward, backward and inference graphs."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._inductor.utils import num_fw_fixed_arguments

    def forward(aot_model: torch.fx.GraphModule, aot_inputs: list, is_inference: bool = False):
        # Parameters and buffers lead the forward's inputs: they are used in place, not copied.
        fixed = num_fw_fixed_arguments(len(example_inputs), len(aot_inputs))
        return NpuGraphed(boxed_nop(aot_model, aot_inputs), range(fixed))

    def backward(aot_model: torch.fx.GraphModule, aot_inputs: list):
        return NpuGraphed(boxed_nop(aot_model, aot_inputs), ())

    return aot_autograd(fw_compiler=forward, bw_compiler=backward,
                        inference_compiler=functools.partial(forward, is_inference=True))(model, example_inputs)


def register() -> None:
    """Register ``"npugraphs"`` with Dynamo (also declared as a ``torch_dynamo_backends`` entry point)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "npugraphs" not in _BACKENDS:
        register_backend(compiler_fn=npugraphs, name="npugraphs")
