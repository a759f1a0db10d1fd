"""npudist: distributed training for PyTorch on (emulated) NPU devices.

Registration of the ``npu`` device (``torch.npu``, ``tensor.npu()``, ``torch.device("npu:0")``) and of the
``hccl`` process-group backend, and of Ascend's fused operators as ``torch.ops.npu.*`` (npu tensors only),
happens in one of two ways:

* automatically at ``import torch``: npudist is a PyTorch out-of-tree device backend (entry point group
  ``torch.backends``, as torch_npu), so with npudist installed ``import torch`` alone brings ``torch.npu``
  and ``init_process_group("hccl")``. ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that off;
* explicitly: ``npudist.register()`` (or ``import npudist.device`` for the device, ``import npudist.hccl``
  for the backend, ``import npudist.ops`` for the fused operators).

``import npudist`` registers only when torch is already imported (``import torch, npudist`` keeps working with
autoload off); otherwise it does no work, so the torch-free layers (``npudist.plan``, ``npudist.models``, the
``npudist`` command) load neither torch nor a C++ extension.
"""
import sys

from npudist.cann import environment as _cann_environment

__version__ = "0.1.0"

# CANN's set_env.sh equivalent: ASCEND_HOME_PATH & co. name npudist's emulated toolkit home unless a real
# one is configured (docs/cann.md). Environment variables only; cheap.
_cann_environment.configure()


def register() -> None:
    """Register the npu device and the hccl backend (idempotent). Raises ImportError/OSError naming the
    missing piece if a C++ extension cannot be loaded."""
    import npudist.device  # noqa: F401  (the npu device; must come first: hccl hands it the runtime)
    import npudist.hccl  # noqa: F401
    import npudist.ops  # noqa: F401  (fused operators, torch.ops.npu.*)
    from npudist.compile import attention

    attention.register()   # npu attention under torch.compile (see there); needs no Dynamo/Inductor import
    _cann_environment.load_libraries()  # libtorch_npu.so + libascendcl.so, as torch_npu's import loads them


def _autoload() -> None:
    """Entry point PyTorch calls at the end of ``import torch`` (group ``torch.backends``).

    torch turns any exception here into a RuntimeError that makes ``import torch`` itself fail, for every
    program in the environment. A broken npudist (say, extensions not built) must not do that: it warns
    with the cause and the fix, and torch works without the npu device."""
    try:
        register()
    except Exception as e:  # noqa: BLE001 - any failure: report, keep torch importable
        # Forget the half-imported package so that the user's own `import npudist` runs registration again
        # and raises the real error where their script asks for npudist.
        for name in [m for m in sys.modules if m == "npudist" or m.startswith("npudist.")]:
            del sys.modules[name]
        import warnings
        warnings.warn(
            f"npudist: the npu device and hccl backend were not registered at `import torch` "
            f"({type(e).__name__}: {e}). torch works without them. Fix the cause above (an extension that is not "
            "built: `pip install --no-build-isolation -e .` in the npudist checkout), or set "
            "TORCH_DEVICE_BACKEND_AUTOLOAD=0 to stop loading npudist with torch. `import npudist` or "
            "`npudist.register()` raises the full error.", RuntimeWarning, stacklevel=2)


def _torch_imported() -> bool:
    """torch is imported and finished initialising. While ``import torch`` runs (that is when it autoloads us),
    CPython marks the module's spec ``_initializing``; registration is then left to ``_autoload``, which keeps a
    failure from breaking ``import torch``."""
    torch = sys.modules.get("torch")
    return torch is not None and not getattr(getattr(torch, "__spec__", None), "_initializing", False)


if _torch_imported():
    register()
