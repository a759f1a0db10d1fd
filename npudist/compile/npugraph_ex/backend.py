"""``torch.compile(backend="npugraph_ex")``: AOTAutograd graphs optimized by FX passes, then replayed as NPUGraphs.

Per compiled graph (forward, backward, inference), in order: user pattern replacement (``register_replacement``),
no-op removal, input in-place restoration (``passes.py``); then capture per input signature (``capture.py``).
Each step can be switched off through ``options`` (``compile_fx``'s third argument, or torchair's
``CompilerConfig``). Counters: ``torch._dynamo.utils.counters["npugraph_ex"]`` (docs/graphs.md).
"""
from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch._dynamo.utils import counters

from npudist.compile.npugraph_ex import passes, patterns
from npudist.compile.npugraph_ex.capture import COUNTERS, capture_graph

# torch_npu's names for the pass switches (its npugraph_ex options), all on by default.
OPTIONS = {"pattern_fusion_pass": True, "remove_noop_ops": True, "input_inplace_pass": True}
# torch_npu's other npugraph_ex options: accepted, without effect here, reported once per process.
_WITHOUT_EFFECT = ("force_eager", "use_graph_pool", "reuse_graph_pool_in_same_fx", "capture_limit", "clone_input",
                   "clone_output", "static_kernel_compile", "super_kernel_optimize", "super_kernel_optimize_options",
                   "super_kernel_debug_options", "frozen_parameter", "remove_cat_ops", "inplace_pass",
                   "post_grad_custom_pre_pass", "post_grad_custom_post_pass", "dump_tensor_data", "data_dump_stage",
                   "data_dump_dir")
_reported: set[str] = set()


def _check_options(options: dict | None) -> dict:
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS) - set(_WITHOUT_EFFECT))
    if unknown:
        raise ValueError(f"npugraph_ex: unknown option(s) {unknown}; the passes are switched by "
                         f"{sorted(OPTIONS)} (each True or False)")
    ignored = sorted(set(options) & set(_WITHOUT_EFFECT) - _reported)
    if ignored:
        _reported.update(ignored)
        warnings.warn(f"npugraph_ex: options accepted but without effect in npudist: {', '.join(ignored)} "
                      "(docs/graphs.md)", stacklevel=3)
    return {**OPTIONS, **{k: bool(v) for k, v in options.items() if k in OPTIONS}}


def optimize(gm: torch.fx.GraphModule, options: dict) -> torch.fx.GraphModule:
    """Run the enabled passes on ``gm`` in place, counting what each rewrote."""
    if options["pattern_fusion_pass"]:
        counters[COUNTERS]["pattern_replacements"] += patterns.apply_patterns(gm)
    if options["remove_noop_ops"]:
        counters[COUNTERS]["noops_removed"] += passes.remove_noops(gm)
    if options["input_inplace_pass"]:
        counters[COUNTERS]["inputs_reinplaced"] += passes.reinplace_input_mutations(gm)
    return gm


def _compile_graph(gm: torch.fx.GraphModule, aot_inputs: list, *, options: dict, fixed: int):
    optimize(gm, options)
    counters[COUNTERS]["graphs"] += 1
    return capture_graph(gm, range(fixed), passes.mutated_inputs(gm))


def compile_fx(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict | None = None):
    """The Dynamo backend function (``backend="npugraph_ex"``, or ``torch.npu.npugraph_ex.compile_fx``)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.utils import num_fw_fixed_arguments

    options = _check_options(options)

    def forward(aot_model: torch.fx.GraphModule, aot_inputs: list, is_inference: bool = False):
        # Parameters and buffers lead the forward's inputs: they are used in place, not copied.
        fixed = num_fw_fixed_arguments(len(example_inputs), len(aot_inputs))
        return _compile_graph(aot_model, aot_inputs, options=options, fixed=fixed)

    def backward(aot_model: torch.fx.GraphModule, aot_inputs: list):
        return _compile_graph(aot_model, aot_inputs, options=options, fixed=0)

    # keep_inference_input_mutations: input mutations stay in the graph (as copy_ nodes the reinplace pass turns
    # into in-place ops) instead of running in AOTAutograd's Python epilogue after every replay.
    return aot_autograd(fw_compiler=forward, bw_compiler=backward,
                        inference_compiler=functools.partial(forward, is_inference=True),
                        keep_inference_input_mutations=True)(gm, example_inputs)


def backend_with(options: dict | None):
    """A Dynamo backend compiling with ``options`` (checked now, so a bad option fails before tracing)."""
    checked = _check_options(options)
    return functools.partial(compile_fx, options=checked)


def register() -> None:
    """Register ``"npugraph_ex"`` with Dynamo (also a ``torch_dynamo_backends`` entry point)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "npugraph_ex" not in _BACKENDS:
        register_backend(compiler_fn=compile_fx, name="npugraph_ex")
