"""Graph mode on npu: ``torch.compile`` through Dynamo and Inductor.

Nothing here is imported by ``import npudist``. Inductor asks the device module for its code generators on the
first compile (``torch._inductor.codegen.common.init_backend_registration`` reads ``torch.npu.Scheduling``,
``PythonWrapperCodegen``, ``CppWrapperCodegen`` and ``WrapperFxCodegen`` through
``torch.utils.backend_registration._get_custom_mod_func``). ``torch.npu.__getattr__`` takes the first of those
lookups as the trigger: it calls :func:`register`, which imports :mod:`npudist.compile.inductor` and registers
everything graph mode needs, then declines the name (AttributeError). Declining is deliberate: Inductor registers
what the lookups return *without* a ``device_custom_config``, which would erase npu's config from Inductor's
cache keys (``npudist/compile/codegen_config.py``); when the lookups fail, Inductor skips its own registration and
npudist's stays. Call :func:`register` yourself only if Dynamo must know the npu device interface before the first
Inductor compile (for instance to trace ``torch.npu.Stream`` objects with a non-Inductor backend).
"""

_CODEGEN_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")


def register() -> None:
    """Register the npu Inductor backend, device op overrides and Dynamo device interface; idempotent."""
    from npudist.compile import inductor

    inductor.register()


def lookup_codegen(name: str):
    """``torch.npu.<name>``: registers graph mode when Inductor looks up one of its four code-generator names, and
    raises AttributeError for every name (see the module docstring for why the names are declined)."""
    if name in _CODEGEN_NAMES:
        register()
        raise AttributeError(f"torch.npu.{name}: npu's Inductor backend is registered by npudist.compile.register() "
                             "(register_backend_for_device with its cache-key config), not through this name")
    raise AttributeError(f"module 'torch.npu' has no attribute {name!r}")
