"""torch_npu's runtime options on the emulated device: ``set_option``, the matmul/conv precision switches
(``torch.npu.matmul.allow_hf32``, ``cube_math_type``, ``torch.npu.conv.allow_hf32``), ``config``,
``set_mm_bmm_format_nd``, ``use_compatible_impl``, ``set_task_queue_enable`` / ``get_task_queue_enable``.

The options select among Ascend kernel implementations (compile and precision modes, internal formats). The
emulated device runs CPU kernels with full-precision results in every case, which each option permits
(``allow_hf32`` allows, never forces, a reduced-precision fp32 matmul; an ND layout is the only layout here),
so the options are validated as torch_npu validates them, kept, and read back; they change no result.
"""
from __future__ import annotations

import enum
import warnings

from npudist import _C
from npudist.device import kernel_queue
from npudist.device.refusal import refuses

__all__ = ["set_option", "CubeMathType", "config", "matmul", "conv", "set_mm_bmm_format_nd",
           "get_mm_bmm_format_nd", "use_compatible_impl", "are_compatible_impl_enabled", "get_task_queue_enable",
           "set_task_queue_enable",
           "set_aoe", "set_op_timeout_ms", "set_device_limit", "get_device_limit", "set_stream_limit",
           "reset_stream_limit", "get_stream_limit"]

# torch_npu's accepted values per ACL option (None: any string).
_CHOICES = {
    "ACL_PRECISION_MODE": ("allow_fp32_to_fp16", "must_keep_origin_dtype"),
    "ACL_OP_SELECT_IMPL_MODE": ("high_performance", "high_precision"),
    "ACL_AICORE_NUM": None,
    "ACL_OPTYPELIST_FOR_IMPLMODE": None,
    "ACL_OP_DEBUG_LEVEL": ("0", "1", "2", "3", "4"),
    "ACL_DEBUG_DIR": None,
    "ACL_OP_COMPILER_CACHE_MODE": ("disable", "enable", "force"),
    "ACL_OP_COMPILER_CACHE_DIR": None,
    "ACL_OP_DEBUG_OPTION": None,
}
_DEPRECATED = ("ACL_OP_SELECT_IMPL_MODE", "ACL_OPTYPELIST_FOR_IMPLMODE")

_options: dict[str, str] = {}
_mm_bmm_nd = True


def set_option(option: dict) -> None:
    """Set ACL options (``{"ACL_PRECISION_MODE": "must_keep_origin_dtype", ...}``); values are checked as
    torch_npu checks them and kept in :func:`get_option`. ``MM_BMM_ND_ENABLE`` also sets the ND flag."""
    if not isinstance(option, dict):
        raise TypeError(f"torch.npu.set_option: option must be a dict, got {type(option).__name__}")
    if option.get("MM_BMM_ND_ENABLE") == "enable":
        set_mm_bmm_format_nd(True)
    elif option.get("MM_BMM_ND_ENABLE") == "disable":
        set_mm_bmm_format_nd(False)
    checked = {}
    for name, value in option.items():
        value = str(value)
        choices = _CHOICES.get(name)
        if name == "ACL_AICORE_NUM" and not (value.isdigit() and 1 <= int(value) <= 32):
            raise ValueError(f"torch.npu.set_option: ACL_AICORE_NUM must be an integer in [1, 32], got {value!r}")
        if choices is not None and value not in choices:
            raise ValueError(f"torch.npu.set_option: {name} must be one of {list(choices)}, got {value!r}")
        if name in _DEPRECATED:
            warnings.warn(f"{name} will be deprecated in a future version (torch_npu); it changes nothing here")
        checked[name] = value
    _options.update(checked)


def get_option(name: str) -> str | None:
    """The value last given to :func:`set_option` for ``name`` (None if never set)."""
    return _options.get(name)


def set_mm_bmm_format_nd(is_nd: bool = True) -> None:
    """Ask mm/bmm to keep the ND format (the only format on the emulated device; read back by the getter)."""
    global _mm_bmm_nd
    _mm_bmm_nd = bool(is_nd)


def get_mm_bmm_format_nd() -> bool:
    return _mm_bmm_nd


class CubeMathType(enum.IntEnum):
    """torch_npu's cube (matmul unit) precision modes for ``torch.npu.matmul.cube_math_type``."""
    KEEP_DTYPE = 0
    ALLOW_FP32_DOWN_PRECISION = 1
    USE_FP16 = 2
    USE_HF32 = 3
    FORCE_GRP_ACC_FOR_FP32 = 4
    USE_FP32_ADD = 4


class _Switches:
    """Attribute-style switches (``torch.npu.matmul.allow_hf32 = True``) with torch_npu's type checks."""

    def __init__(self, prefix: str, fields: dict[str, object]):
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_fields", dict(fields))

    def __getattr__(self, name: str):
        fields = object.__getattribute__(self, "_fields")
        if name in fields:
            return fields[name]
        raise AttributeError(f"torch.npu.{self._prefix} has no attribute {name!r}; it has {sorted(fields)}")

    def __setattr__(self, name: str, value) -> None:
        if name not in self._fields:
            raise AttributeError(f"torch.npu.{self._prefix} has no attribute {name!r}; it has {sorted(self._fields)}")
        if name.startswith("allow_") and not isinstance(value, bool):
            raise TypeError(f"torch.npu.{self._prefix}.{name} must be a bool, got {type(value).__name__}")
        if name == "cube_math_type" and not isinstance(value, CubeMathType):
            raise TypeError(f"torch.npu.{self._prefix}.cube_math_type must be a torch.npu.CubeMathType, "
                            f"got {type(value).__name__}")
        self._fields[name] = value

    def __repr__(self) -> str:
        return f"torch.npu.{self._prefix}({self._fields})"


# Defaults as torch_npu reports them before anything is set: matmul hf32 off, conv hf32 on.
matmul = _Switches("matmul", {"allow_hf32": False, "cube_math_type": None})
conv = _Switches("conv", {"allow_hf32": True})
config = _Switches("config", {"allow_internal_format": False})

_compatible_impl = False


def use_compatible_impl(is_enable: bool) -> None:
    """Ask for operator implementations whose results match other devices' (every npu kernel here is the
    CPU kernel, so results always match); read back by :func:`are_compatible_impl_enabled`."""
    global _compatible_impl
    _compatible_impl = bool(is_enable)


def are_compatible_impl_enabled() -> bool:
    return _compatible_impl


def get_task_queue_enable() -> int:
    """The task-queue level in effect: 0 when ops launch synchronously (``ASCEND_LAUNCH_BLOCKING=1`` whatever
    was set, ``TASK_QUEUE_ENABLE=0``, ``set_task_queue_enable(0)``), else 1 or 2 as set (default 1)."""
    return _C._task_queue_level()


def set_task_queue_enable(mode) -> None:
    """Switch the task queue at run time, as torch_npu does: 0 launches every npu op synchronously (blocking
    launch), 1 and 2 queue kernels on their stream (level 2 tunes torch_npu's own two-stage queue, absent here:
    it queues as 1 does). Every device is drained first, so no kernel queued before the switch is left behind;
    a queued kernel's error surfaces here. ``ASCEND_LAUNCH_BLOCKING=1`` keeps the effective level at 0."""
    if isinstance(mode, str):
        mode = int(mode) if mode.strip().isdigit() else mode
    if isinstance(mode, bool) or mode not in (0, 1, 2):
        raise ValueError(f"set_task_queue_enable: mode must be 0, 1 or 2, but got {mode!r}")
    kernel_queue.drain_all_devices()
    _C._set_task_queue_level(int(mode))


@refuses("AOE tunes operator kernels by running them on the AI cores")
def set_aoe(dump_path): ...


@refuses("the per-operator execution timeout is enforced by the AI-core task scheduler")
def set_op_timeout_ms(timeout): ...


@refuses("it limits the cube and vector AI cores that kernels of the device may use")
def set_device_limit(device, cube_num=-1, vector_num=-1): ...


@refuses("it reports the cube and vector AI cores that kernels of the device may use")
def get_device_limit(device): ...


@refuses("it limits the cube and vector AI cores that kernels of a stream may use")
def set_stream_limit(stream, cube_num=-1, vector_num=-1): ...


@refuses("it lifts a stream's limit on cube and vector AI cores")
def reset_stream_limit(stream): ...


@refuses("it reports the cube and vector AI cores that kernels of a stream may use")
def get_stream_limit(stream): ...
