"""NPU graphs (mirror ``torch.cuda.graphs``): capture a stream's npu work once, replay it without Python.

Semantics (docs/graphs.md): during capture every npu op on the capturing stream runs as usual *and* is recorded
(the boxed CPU kernel with its arguments over the npu bytes); :meth:`NPUGraph.replay` re-runs the recorded kernels
from C++ over the same memory. The graph keeps every storage it touches alive (its private pool), so static
inputs and outputs keep their addresses. Random ops advance the npu generator on each replay exactly as eager.
"""
from __future__ import annotations

import gc
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from npudist import _C
from npudist.device import core, streams, super_kernel
from npudist.device.graph_handlers import _GraphDispatchMode

_CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


def is_current_stream_capturing() -> bool:
    """True if the calling thread's current npu stream is capturing an NPUGraph."""
    return _C._is_current_stream_capturing()


def graph_pool_handle() -> tuple[int, int]:
    """A new memory-pool token to pass as ``pool=`` to :meth:`NPUGraph.capture_begin` / :class:`graph`."""
    return (0, _C._graph_pool_handle())


def _pool_id(pool: Any) -> int:
    if pool is None:
        return 0
    if isinstance(pool, tuple) and len(pool) == 2 and all(isinstance(p, int) for p in pool):
        return pool[1]
    raise ValueError(f"pool must be None or a token from torch.npu.graph_pool_handle() / NPUGraph.pool(), got {pool!r}")


def _check_mode(mode: str) -> str:
    if mode not in _CAPTURE_ERROR_MODES:
        raise ValueError(f"capture_error_mode must be one of {_CAPTURE_ERROR_MODES}, got {mode!r}")
    return mode


class NPUGraph:
    """A captured sequence of npu work (``torch.cuda.CUDAGraph``'s interface)."""

    def __init__(self):
        self._graph = _C._NPUGraph()
        # torch.npu.graph(g, auto_dispatch_capture=True) sets it: handled operators' calls get task groups that
        # update() re-issues with new arguments (graph_handlers.py).
        self.auto_dispatch_capture = False
        self.graph_dispatch_mode = _GraphDispatchMode()

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        """Begin capturing the current stream's npu work (it must not be the default stream)."""
        self._graph.capture_begin(_pool_id(pool), _check_mode(capture_error_mode))

    def capture_end(self) -> None:
        """End the capture; raises if an op during capture was not capturable (the graph is then discarded)."""
        self._graph.capture_end()

    def replay(self) -> None:
        """Re-run the captured work over the graph's static tensors."""
        self._graph.replay()

    def reset(self) -> None:
        """Drop the captured work and release the graph's memory (tensors still referenced elsewhere stay)."""
        self._graph.reset()

    def pool(self) -> tuple[int, int]:
        """The graph's pool token (pass it as ``pool=`` to capture another graph in the same pool)."""
        return (0, self._graph.pool())

    def debug_dump(self, debug_path: str) -> None:
        """Write the recorded task list (ops, arguments, static outputs) to ``debug_path``."""
        self._graph.debug_dump(str(debug_path))

    def num_tasks(self) -> int:
        """How many tasks (kernels, copies, event nodes, super kernels) a replay launches."""
        return self._graph.num_tasks()

    def num_task_groups(self) -> int:
        """How many task groups (graph_task_group_begin / _end) the current capture has."""
        return self._graph.num_task_groups()

    def super_kernel_optimize(self, optimize_options=None, debug_options=None) -> None:
        """Fuse each super-kernel scope of the capture into one task: one launch per scope at replay.

        Option names and types are torch_npu's (RuntimeError for an unknown key or a wrong type). Effective here:
        ``debug_options["debug_sync_all"]`` (non-zero: synchronize after every sub-kernel instead of letting
        independent sub-kernels run together) and ``optimize_options["aggressive_opt_strategies"]
        ["event_breaker_bypass"]`` (non-zero: an ExternalEvent wait inside a scope is fused instead of ending the
        super kernel). The others tune Ascend code generation and have no effect on the emulated device
        (docs/graphs.md, "Super kernels").
        """
        super_kernel.validate_options("optimize_options", optimize_options)
        super_kernel.validate_options("debug_options", debug_options)
        strategies = (optimize_options or {}).get("aggressive_opt_strategies", {})
        self._graph.super_kernel_optimize(sync_all=bool((debug_options or {}).get("debug_sync_all", 0)),
                                          fuse_event_waits=bool(strategies.get("event_breaker_bypass", 0)))

    def num_super_kernel_scopes(self) -> int:
        """How many closed super-kernel scopes the capture has that super_kernel_optimize has not fused yet."""
        return self._graph.num_super_kernel_scopes()

    def update(self, cpu_update_input) -> None:
        """Re-issue the handled operator calls of an ``auto_dispatch_capture`` capture with new arguments.

        ``cpu_update_input``: one dict per recorded call (or one for all), e.g. ``[{"actual_seq_lengths": [100]}]``;
        the next replay waits for the update and runs the calls with these arguments (docs/graph_task_update.md).
        """
        if not self.auto_dispatch_capture:
            raise RuntimeError("NPUGraph.update: this graph was not captured with auto_dispatch_capture=True; capture "
                               "it under torch.npu.graph(g, auto_dispatch_capture=True) to update its operators")
        self.graph_dispatch_mode.update_capture_record(cpu_update_input)


class graph:
    """Context manager capturing npu work into ``npu_graph`` (``torch.cuda.graph``'s interface).

    Synchronises the device, then captures on ``stream`` (default: one side stream per device shared by all
    captures, as torch.cuda does, which no ``torch.npu.Stream()`` ever is). ``pool`` shares a memory-pool token
    with other graphs.
    """

    default_capture_stream: streams.Stream | None = None

    def __init__(self, npu_graph: NPUGraph, pool: Any = None, stream: torch.Stream | None = None,
                 auto_dispatch_capture: bool = False, capture_error_mode: str = "global"):
        if not isinstance(npu_graph, NPUGraph):
            raise TypeError(f"torch.npu.graph expects a torch.npu.NPUGraph, got {type(npu_graph).__name__}")
        if stream is None:
            if graph.default_capture_stream is None or \
                    graph.default_capture_stream.device_index != core.current_device():
                graph.default_capture_stream = streams.graph_capture_stream(core.current_device())
            stream = graph.default_capture_stream
        self.npu_graph = npu_graph
        self.pool = pool
        self.capture_error_mode = _check_mode(capture_error_mode)
        self.capture_stream = stream
        self.stream_ctx = streams.stream(stream)
        npu_graph.auto_dispatch_capture = bool(auto_dispatch_capture)
        if npu_graph.auto_dispatch_capture:
            npu_graph.graph_dispatch_mode = _GraphDispatchMode()  # this capture's records only

    def __enter__(self):
        core.synchronize()
        gc.collect()
        self.stream_ctx.__enter__()
        try:
            self.npu_graph.capture_begin(self.pool, self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise
        if self.npu_graph.auto_dispatch_capture:
            self.npu_graph.graph_dispatch_mode.__enter__()

    def __exit__(self, exc_type, exc, tb):
        if self.npu_graph.auto_dispatch_capture:
            self.npu_graph.graph_dispatch_mode.__exit__(exc_type, exc, tb)
        try:
            if exc_type is None:
                self.npu_graph.capture_end()
            else:
                # The body raised: end (and discard) the capture, and let the body's exception propagate.
                try:
                    self.npu_graph.capture_end()
                except RuntimeError:
                    pass
                self.npu_graph.reset()
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)
            # Kernels run during capture (unlike CUDA's): the capture stream's writes (static outputs, inputs
            # updated in place) must be visible to work issued after the block on the caller's stream.
            streams.current_stream().wait_stream(self.capture_stream)
        return False


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool: Any = None):
    """Graphed versions of ``callables`` (functions or modules): forward and backward each replay an NPUGraph.

    Same contract as ``torch.cuda.make_graphed_callables``: ``sample_args`` are tensors (a tuple, or a tuple of
    tuples for several callables) whose ``requires_grad`` matches the real inputs; modules have no hooks and
    only parameters require grad; later calls pass arguments in the same order and format. Graphs of several
    callables share one pool token.
    """
    if torch.is_autocast_enabled("npu") and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching. "
                           "Please set `cache_enabled=False`.")
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    if len(callables) != len(sample_args):
        raise ValueError(f"make_graphed_callables: {len(callables)} callables but {len(sample_args)} sample_args")

    flat_args = []
    for c, args in zip(callables, sample_args):
        if isinstance(c, torch.nn.Module):
            if c._backward_hooks or c._forward_hooks or c._forward_pre_hooks:
                raise ValueError("Modules must not have hooks registered at the time they are passed to "
                                 "make_graphed_callables (registering hooks afterwards is allowed).")
            if any(b.requires_grad for b in c.buffers()):
                raise ValueError("In a module passed to make_graphed_callables only parameters may require grad; "
                                 "set requires_grad=False on its buffers.")
        leaves = pytree.arg_tree_leaves(*args)
        if not all(isinstance(a, torch.Tensor) for a in leaves):
            raise TypeError("make_graphed_callables: sample_args must contain only Tensors")
        flat_args.append(tuple(leaves))

    module_params = [tuple(c.parameters()) if isinstance(c, torch.nn.Module) else () for c in callables]
    surfaces = [flat_args[i] + module_params[i] for i in range(len(callables))]
    fwd_graphs = [NPUGraph() for _ in callables]
    bwd_graphs = [NPUGraph() for _ in callables]
    mempool = graph_pool_handle() if pool is None else pool

    def grads_of(outputs, surface):
        outs = tuple(o for o in outputs if o.requires_grad)
        if not outs:
            return None
        return torch.autograd.grad(outputs=outs, inputs=tuple(i for i in surface if i.requires_grad),
                                   grad_outputs=tuple(torch.empty_like(o) for o in outs), only_inputs=True,
                                   allow_unused=allow_unused_input)

    # Warm up on a side stream (lazy initialisation, autograd's first-call work), as torch.cuda does.
    core.synchronize()
    with streams.stream(streams.Stream()):
        for func, args, surface in zip(callables, sample_args, surfaces):
            for _ in range(num_warmup_iters):
                grads_of(pytree.tree_leaves(func(*args)), surface)
    core.synchronize()

    static_outputs, output_specs = [], []
    for func, args, fwd_graph in zip(callables, sample_args, fwd_graphs):
        with graph(fwd_graph, pool=mempool):
            outputs = func(*args)
        flat, spec = pytree.tree_flatten(outputs)
        static_outputs.append(tuple(flat))
        output_specs.append(spec)

    # Backward graphs in reverse order, as the live workload runs them.
    static_grad_outputs, static_grad_inputs = [None] * len(callables), [None] * len(callables)
    for i in reversed(range(len(callables))):
        grad_outs = tuple(torch.empty_like(o) if o.requires_grad else None for o in static_outputs[i])
        needing = tuple(o for o in static_outputs[i] if o.requires_grad)
        grad_inputs = None
        if needing:
            with graph(bwd_graphs[i], pool=mempool):
                grad_inputs = torch.autograd.grad(
                    outputs=needing, inputs=tuple(s for s in surfaces[i] if s.requires_grad),
                    grad_outputs=tuple(g for g in grad_outs if g is not None), only_inputs=True,
                    allow_unused=allow_unused_input)
        it = iter(grad_inputs or ())
        static_grad_inputs[i] = tuple(next(it) if s.requires_grad and grad_inputs is not None else None
                                      for s in surfaces[i])
        static_grad_outputs[i] = grad_outs

    graphed = [
        _graphed_function(fwd_graphs[i], bwd_graphs[i], module_params[i], len(flat_args[i]), output_specs[i],
                          surfaces[i], static_outputs[i], static_grad_outputs[i], static_grad_inputs[i])
        for i in range(len(callables))
    ]
    result = []
    for func, fn in zip(callables, graphed):
        if isinstance(func, torch.nn.Module):
            func.forward = _graphed_forward(func, func.training, fn, func.forward)
            result.append(func)
        else:
            result.append(fn)
    return result[0] if just_one else tuple(result)


def _graphed_function(fwd_graph, bwd_graph, module_params, n_user_args, output_spec, surface, static_outputs,
                      static_grad_outputs, static_grad_inputs) -> Callable:
    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for i in range(n_user_args):
                if surface[i].data_ptr() != inputs[i].data_ptr():
                    surface[i].copy_(inputs[i])
            fwd_graph.replay()
            return tuple(o.detach() for o in static_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            for static, grad in zip(static_grad_outputs, grads):
                if static is not None and grad is not None and static.data_ptr() != grad.data_ptr():
                    static.copy_(grad)
            bwd_graph.replay()
            return tuple(g.detach() if g is not None else None for g in static_grad_inputs)

    def functionalized(*user_args):
        flat = pytree.arg_tree_leaves(*user_args)
        if len(flat) != n_user_args:
            raise ValueError(f"graphed callable: expected {n_user_args} tensor arguments (as in sample_args), "
                             f"got {len(flat)}")
        return pytree.tree_unflatten(Graphed.apply(*(tuple(flat) + module_params)), output_spec)

    return functionalized


def _graphed_forward(module: torch.nn.Module, training: bool, graphed: Callable, eager_forward: Callable):
    # The graphs were captured in one training mode; the other mode runs the module eagerly.
    def forward(*args, **kwargs):
        if module.training == training:
            return graphed(*args, **kwargs)
        return eager_forward(*args, **kwargs)

    return forward


__all__ = ["NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables"]
