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
    missing piece if a C++ extension cannot be loaded, and ``npudist.env.EnvVarError`` (a ValueError) naming a
    malformed environment variable (docs/environment.md)."""
    from npudist import env

    env.check(("device",))  # before the device extension loads: it reads these variables once
    import npudist.device  # noqa: F401  (the npu device; must come first: hccl hands it the runtime)
    import npudist.hccl  # noqa: F401  (registration reads no variable: each process group checks its own)
    import npudist.ops  # noqa: F401  (fused operators, torch.ops.npu.*)
    from npudist.compile import attention
    from npudist.device import attention as device_attention

    attention.register()   # npu attention under torch.compile (see there); needs no Dynamo/Inductor import
    device_attention.register()   # npu DTensor attention: the flash operator DTensor and context_parallel know
    _cann_environment.load_libraries()  # libtorch_npu.so + libascendcl.so, as torch_npu's import loads them
    env.check(("hccl", "engine", "data"))


def _forget_package() -> None:
    """Forget the half-imported package so that the user's own `import npudist` runs registration again and
    raises the real error where their script asks for npudist."""
    for name in [m for m in sys.modules if m == "npudist" or m.startswith("npudist.")]:
        del sys.modules[name]


def _autoload() -> None:
    """Entry point PyTorch calls at the end of ``import torch`` (group ``torch.backends``).

    torch turns any exception here into a RuntimeError that makes ``import torch`` itself fail, for every
    program in the environment. A broken npudist (say, extensions not built) must not do that: it warns
    with the cause and the fix, and torch works without the npu device. A malformed environment variable
    is reported the same way, and every later use of what it configures raises its error
    (``npudist.unavailable``)."""
    if _initializing("npudist.device"):
        # `import npudist.device` (or a module under it) came first and imported torch, which autoloads us before
        # that package has renamed PrivateUse1 to npu: registering the operators now fails on the device name
        # "npu" (a false warning, as the device then works). The package finishes registration as its last step;
        # it is still being imported up the stack then, so a failure must leave its modules in sys.modules.
        from npudist import _deferred

        _deferred.defer(lambda: _register_reporting_failures(forget=False))
        return
    _register_reporting_failures(forget=True)


def _initializing(name: str) -> bool:
    """Module `name` is being imported: its body is running up the stack."""
    module = sys.modules.get(name)
    return module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False)


def _register_reporting_failures(forget: bool) -> None:
    """register(), turning a failure into a RuntimeWarning with the cause and the fix (see _autoload)."""
    import warnings

    from npudist import env

    try:
        register()
    except env.EnvVarError as e:
        if not hasattr(sys.modules.get("torch"), "npu"):
            from npudist import unavailable

            unavailable.install(e)
            if forget:
                _forget_package()
            what = ("The npu device and the hccl backend are unavailable: every use of them raises this error "
                    "until the variable is fixed")
        else:
            what = ("The npu device works; creating an hccl process group raises this error until the variable "
                    "is fixed")
        warnings.warn(f"npudist: {e}. {what} (accepted values: docs/environment.md). torch works without npudist "
                      "with TORCH_DEVICE_BACKEND_AUTOLOAD=0.", RuntimeWarning, stacklevel=2)
    except Exception as e:  # noqa: BLE001 - any failure: report, keep torch importable
        if forget:
            _forget_package()
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
    return "torch" in sys.modules and not _initializing("torch")


if _torch_imported():
    register()
