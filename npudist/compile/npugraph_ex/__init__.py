"""``torch.npu.npugraph_ex`` (and ``torch_npu.npu.npugraph_ex``): the npugraph_ex graph-mode backend's public face.

``compile_fx(gm, example_inputs, options=None)`` is the Dynamo backend ``torch.compile(backend="npugraph_ex")``
runs; ``register_replacement`` adds user patterns its pattern pass applies. Implementation: ``backend.py``
(pipeline), ``passes.py`` (in-place restoration, no-op removal), ``patterns.py``, ``capture.py`` (NPUGraph capture
split at collectives), ``inference`` (``cache_compile``, ``readable_cache``: ``cache.py``). Importing this package
is cheap: Dynamo and Inductor load on first use. torch_npu's ``scope`` is not provided (docs/graphs.md).
"""
from __future__ import annotations

from npudist.compile.npugraph_ex import inference

__all__ = ["compile_fx", "register_replacement", "inference"]


def compile_fx(gm, example_inputs=None, options=None):
    """Compile the Dynamo graph ``gm`` with the npugraph_ex pipeline (docs/graphs.md, "npugraph_ex")."""
    from npudist.compile.npugraph_ex import backend

    return backend.compile_fx(gm, example_inputs, options)


def register_replacement(search_fn, replace_fn, example_inputs, trace_fn=None, extra_check=None,
                         search_fn_pattern=None, scalar_workaround=None, skip_duplicates=False):
    """torch_npu's ``register_replacement`` (see :func:`npudist.compile.npugraph_ex.patterns.register_replacement`)."""
    from npudist.compile.npugraph_ex import patterns

    kwargs = {} if extra_check is None else {"extra_check": extra_check}
    return patterns.register_replacement(search_fn, replace_fn, example_inputs, trace_fn=trace_fn,
                                         search_fn_pattern=search_fn_pattern, scalar_workaround=scalar_workaround,
                                         skip_duplicates=skip_duplicates, **kwargs)


def register() -> None:
    """Register the ``"npugraph_ex"`` Dynamo backend (idempotent)."""
    from npudist.compile.npugraph_ex import backend

    backend.register()
