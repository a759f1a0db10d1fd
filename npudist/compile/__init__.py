"""Graph mode on npu: ``torch.compile`` through Dynamo and Inductor.

Nothing here is imported by ``import npudist``. Inductor asks the device module for its code generators on the
first compile (``torch._inductor.codegen.common.init_backend_registration`` reads ``torch.npu.Scheduling``,
``PythonWrapperCodegen``, ``CppWrapperCodegen`` and ``WrapperFxCodegen`` through
``torch.utils.backend_registration._get_custom_mod_func``); ``torch.npu.__getattr__`` answers those four names
by calling :func:`register`, which imports :mod:`npudist.compile.inductor` and registers everything graph mode
needs. Call :func:`register` yourself only if Dynamo must know the npu device interface before the first
Inductor compile (for instance to trace ``torch.npu.Stream`` objects with a non-Inductor backend).
"""

_CODEGEN_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")


def register() -> None:
    """Register the npu Inductor backend, device op overrides and Dynamo device interface; idempotent."""
    from npudist.compile import inductor

    inductor.register()


def lookup_codegen(name: str):
    """``torch.npu.<name>`` for the four code-generator names Inductor looks up; AttributeError otherwise."""
    if name not in _CODEGEN_NAMES:
        raise AttributeError(f"module 'torch.npu' has no attribute {name!r}")
    from npudist.compile import inductor

    inductor.register()
    return getattr(inductor, name)
