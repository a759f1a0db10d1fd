"""torchair's entry points (``torch_npu.dynamo.torchair``) mapped onto npudist's graph-mode backends.

``CompilerConfig.mode``: ``"max-autotune"`` → npudist's Inductor path (``torch.compile``'s default backend with
the npu code generators), ``"reduce-overhead"`` → ``npugraphs``, ``"npugraph_ex"`` → ``npugraph_ex`` with the
config's pass switches. ``get_npu_backend`` returns the Dynamo backend; ``get_compiler`` the compiler of one
AOTAutograd (aten) graph, as torchair's does.
"""
from __future__ import annotations

import functools

from npudist.compile.torchair_config import CompilerConfig, honored_options


def _config(compiler_config) -> CompilerConfig:
    if compiler_config is None:
        return CompilerConfig()
    if not isinstance(compiler_config, CompilerConfig):
        raise TypeError(f"compiler_config must be a torchair CompilerConfig, got {type(compiler_config).__name__}")
    return compiler_config


def _inductor(gm, example_inputs, decompositions=None):
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.decomposition import select_decomp_table

    from npudist import compile as npu_compile

    npu_compile.register()
    if decompositions:
        return compile_fx(gm, example_inputs, decompositions={**select_decomp_table(), **decompositions})
    return compile_fx(gm, example_inputs)


def get_npu_backend(*, compiler_config: CompilerConfig | None = None, custom_decompositions: dict | None = None):
    """The Dynamo backend for ``compiler_config`` (``torch.compile(model, backend=get_npu_backend(...))``).

    ``custom_decompositions`` join Inductor's in ``max-autotune``; the other modes run aten ops undecomposed and
    report them as without effect."""
    config = _config(compiler_config)
    options = honored_options(config)
    if config.mode == "max-autotune":
        return functools.partial(_inductor, decompositions=dict(custom_decompositions or {}))
    if custom_decompositions:
        import warnings

        warnings.warn(f"get_npu_backend: custom_decompositions have no effect in mode {config.mode!r} "
                      "(its graphs run aten ops as traced)", stacklevel=2)
    if config.mode == "reduce-overhead":
        from npudist.compile.npugraphs import npugraphs

        return npugraphs
    from npudist.compile.npugraph_ex.backend import backend_with

    return backend_with(options)


def get_compiler(compiler_config: CompilerConfig | None = None):
    """The compiler of one AOTAutograd graph for ``compiler_config``: ``compiler(gm, example_inputs)`` returns a
    callable (AOTAutograd's boxed convention where it says so), to pass as ``fw_compiler`` / ``bw_compiler``."""
    config = _config(compiler_config)
    options = honored_options(config)
    if config.mode == "max-autotune":
        from torch._inductor.compile_fx import compile_fx_inner

        from npudist import compile as npu_compile

        npu_compile.register()
        return compile_fx_inner
    from torch._dynamo.backends.debugging import boxed_nop

    from npudist.compile.npugraphs import NpuGraphed

    if config.mode == "reduce-overhead":
        return lambda gm, example_inputs: NpuGraphed(boxed_nop(gm, example_inputs), ())
    from npudist.compile.npugraph_ex import backend, passes
    from npudist.compile.npugraph_ex.capture import capture_graph

    checked = backend._check_options(options)

    def compile_graph(gm, example_inputs):
        backend.optimize(gm, checked)
        return capture_graph(gm, (), passes.mutated_inputs(gm))
    return compile_graph


def npu_backend(gm, example_inputs):
    """``torch.compile(backend="npu")``: torchair's default configuration (max-autotune, the Inductor path)."""
    return get_npu_backend()(gm, example_inputs)


def register() -> None:
    """Register ``"npu"`` with Dynamo (idempotent); ``"npugraph_ex"`` is registered by its package."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    from npudist.compile import npugraph_ex

    npugraph_ex.register()
    if "npu" not in _BACKENDS:
        register_backend(compiler_fn=npu_backend, name="npu")
