"""Every environment variable npudist reads: one table of typed readers, and the check that runs before a
component uses them (docs/environment.md lists the same variables for users).

A malformed value is an ``EnvVarError`` (a ValueError) naming the variable, the value and the accepted form.
Booleans accept 1/0, true/false, yes/no, on/off (any case); an empty value counts as unset, except where the
table says otherwise. Several variables are read by the C++ extensions, whose readers are simpler (some take
any value but "0" as true); ``check`` therefore rewrites a valid value the extension would misread into its
canonical spelling (``ASCEND_LAUNCH_BLOCKING=false`` becomes ``0``) before the extension loads.

Torch-free and standard-library only: ``npurun`` and ``npu-smi`` use it before torch is imported.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_DEVICES = 64          # NPUDIST_MAX_DEVICES of the runtime
INT32_MAX = 2**31 - 1     # the hccl extension reads these variables into a C int

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
BOOL_FORM = "1/0, true/false, yes/no or on/off"

# The runtime's size syntax (device_core/runtime/runtime.cpp parse_size): case-sensitive units.
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KiB": 1 << 10,
               "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
SIZE_FORM = "a positive size such as 16GiB, 512MiB, 1GB or a byte count"


class EnvVarError(ValueError):
    """A malformed environment variable. ``name`` and ``value`` identify it; the message says what is accepted."""

    def __init__(self, name: str, value: str, accepted: str, noun: str = "valid", problem: str = "") -> None:
        self.name, self.value, self.accepted = name, value, accepted
        what = f" {problem}" if problem else ""
        super().__init__(f"{name}={value!r} is not {noun}{what}: expected {accepted}; fix it or unset {name}")


@dataclass(frozen=True)
class Variable:
    """One variable npudist reads. ``parse`` turns a set, non-empty value into a Python value (raising
    ValueError with the problem); ``spell`` gives the spelling the C++ reader understands (None: unset it)."""

    name: str
    group: str                  # who reads it: "device", "hccl", "engine", "data"
    noun: str                   # what the value should be, for "X='v' is not <noun>"
    accepted: str               # the accepted form, as in messages and docs/environment.md
    default: object             # the value when unset (or empty, unless keep_empty)
    parse: Callable[[str], object]
    spell: Callable[[object], str | None] | None = None
    keep_empty: bool = False    # an empty value means something of its own (not "unset")


def parse_bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("")


def _spell_bool(value: bool) -> str:
    return "1" if value else "0"


def _int_parser(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        # No int(): it accepts "1_000" and " 1 ", which the C++ readers (strtol) read differently.
        if not re.fullmatch(r"[+-]?[0-9]+", raw.strip()):
            raise ValueError("")
        value = int(raw.strip())
        if not minimum <= value <= maximum:
            raise ValueError("")
        return value
    return parse


def parse_size(raw: str) -> int:
    """A size such as 16GiB, 512MiB, 1GB or a byte count, as the runtime reads NPUDIST_DEVICE_MEMORY."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", raw)
    unit = _SIZE_UNITS.get(m.group(2)) if m else None
    try:
        value = float(m.group(1)) * unit if m and unit else -1.0
    except ValueError:
        value = -1.0
    if not (value >= 1 and math.isfinite(value)):
        raise ValueError("")
    return int(value)


def _choice_parser(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        text = raw.strip()
        for c in choices:
            if text.lower() == c.lower():
                return c
        raise ValueError("")
    return parse


def _text(raw: str) -> str:
    return raw


def parse_visible_devices(raw: str) -> list[int]:
    """ASCEND_RT_VISIBLE_DEVICES: distinct device ids, comma-separated; empty = none (the runtime's rule)."""
    if not raw.strip():
        return []
    ids = []
    for item in raw.split(","):
        if not re.fullmatch(r"\s*[0-9]+\s*", item):
            raise ValueError(f"({item.strip()!r} is not a device id)" if item.strip() else "(an empty item)")
        dev = int(item)
        if dev in ids:
            raise ValueError(f"(device {dev} is listed twice)")
        ids.append(dev)
    return ids


def _bool(name, group, default, spell=False):
    return Variable(name, group, "a boolean", BOOL_FORM, default, parse_bool, _spell_bool if spell else None)


def _int(name, group, noun, default, minimum, maximum, unit):
    accepted = f"a whole number of {unit} in {minimum}..{maximum}"
    return Variable(name, group, noun, accepted, default, _int_parser(minimum, maximum), str)


def _engine_kib(name: str, default_kib: int) -> Variable:
    return _int(name, "engine", "a size in KiB", default_kib, 1, 1 << 30, "KiB")


def _spell_direct(value: str) -> str | None:
    return {"auto": None, "1": "1", "0": "0"}[value]


def _parse_direct(raw: str) -> str:
    text = raw.strip().lower()
    if text == "auto":
        return "auto"
    return _spell_bool(parse_bool(text))


def _spell_present(value: bool) -> str | None:
    """For a C++ reader that tests whether the variable is set at all."""
    return "1" if value else None


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    # The device runtime (device_core/runtime/runtime.cpp, launch.cpp, runtime_memory.cpp, allocator).
    _int("NPUDIST_DEVICE_COUNT", "device", "a device count", 8, 0, MAX_DEVICES, "devices"),
    Variable("ASCEND_RT_VISIBLE_DEVICES", "device", "a device list",
             "comma-separated distinct device ids such as 0,2,3 (each below NPUDIST_DEVICE_COUNT); empty = no "
             "device", None, parse_visible_devices, lambda ids: ",".join(map(str, ids)), keep_empty=True),
    Variable("NPUDIST_DEVICE_MEMORY", "device", "a positive size", SIZE_FORM, 16 << 30, parse_size),
    _bool("NPUDIST_LAUNCH_BLOCKING", "device", None, spell=True),
    _bool("ASCEND_LAUNCH_BLOCKING", "device", False, spell=True),
    Variable("TASK_QUEUE_ENABLE", "device", "a task-queue level", "0 (ops launch synchronously), 1 or 2 (queued)",
             "1", _choice_parser(("0", "1", "2")), str),
    _int("NPUDIST_LAUNCH_QUEUE_DEPTH", "device", "a queue depth", 1024, 0, 1 << 20, "kernels (0: unbounded)"),
    _int("NPUDIST_LAUNCH_INLINE_NS", "device", "a kernel time", 2000, 0, 10**9, "nanoseconds (0: always queue)"),
    _bool("NPUDIST_SHARED_DEVICE_MEMORY", "device", True, spell=True),
    _bool("PYTORCH_NO_NPU_MEMORY_CACHING", "device", False, spell=True),
    Variable("PYTORCH_NPU_ALLOC_CONF", "device", "an allocator configuration",
             "comma-separated key:value options (docs/memory.md), parsed by the allocator at its first use", "",
             _text),
    _bool("NPUDIST_STREAM_SANITIZER", "device", False),
    Variable("OOM_SNAPSHOT_ENABLE", "device", "a snapshot mode", "0 (off), 1 (state and history) or 2 (state only)",
             "0", _choice_parser(("0", "1", "2"))),
    Variable("OOM_SNAPSHOT_PATH", "device", "a directory", "a directory (created if missing)", None, _text),
    # The hccl backend (npudist/hccl/csrc/process_group_hccl.cpp, communicator_factory.cpp, topology.cpp).
    _int("HCCL_EXEC_TIMEOUT", "hccl", "a timeout", None, 1, INT32_MAX, "seconds"),
    _int("HCCL_CONNECT_TIMEOUT", "hccl", "a timeout", 120, 1, INT32_MAX, "seconds"),
    _int("HCCL_BUFFSIZE", "hccl", "a buffer size", 200, 1, INT32_MAX, "MB"),
    Variable("HCCL_DETERMINISTIC", "hccl", "a determinism level", "false, true or strict (any case)", "false",
             _choice_parser(("false", "true", "strict")), str),
    Variable("TORCH_HCCL_ASYNC_ERROR_HANDLING", "hccl", "an error-handling mode",
             "0, 1, 2 or 3 (docs/debugging.md)", 1, _int_parser(0, 3), str),
    Variable("HCCL_ASYNC_ERROR_HANDLING", "hccl", "an error-handling mode",
             "0, 1, 2 or 3 (the older name of TORCH_HCCL_ASYNC_ERROR_HANDLING)", None, _int_parser(0, 3), str),
    _bool("TORCH_HCCL_BLOCKING_WAIT", "hccl", False, spell=True),
    _bool("TORCH_HCCL_ENABLE_MONITORING", "hccl", False, spell=True),
    _int("TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC", "hccl", "a timeout", 600, 1, INT32_MAX, "seconds"),
    _bool("TORCH_HCCL_DUMP_ON_TIMEOUT", "hccl", False, spell=True),
    _int("TORCH_HCCL_TRACE_BUFFER_SIZE", "hccl", "a trace size", 2000, 0, INT32_MAX, "entries"),
    Variable("TORCH_HCCL_DEBUG_INFO_TEMP_FILE", "hccl", "a path prefix", "a path prefix (the rank is appended)",
             "/tmp/hccl_trace_rank_", _text),
    Variable("NPUDIST_NODE_ID", "hccl", "a node id", "any non-empty text", None, _text),
    Variable("NPUDIST_JOB_ID", "hccl", "a job id", "any text (its first 16 letters and digits are used)", None,
             _text),
    Variable("NPUDIST_HCCL_COMMUNICATOR", "hccl", "a communicator choice", "auto or gloo", "auto",
             _choice_parser(("auto", "gloo")), str),
    # The shared-memory engine under hccl (npudist/hccl/engine/).
    _engine_kib("NPUDIST_ENGINE_CHUNK_KB", 256),
    _engine_kib("NPUDIST_ENGINE_REDUCE_CHUNK_KB", 1024),
    _engine_kib("NPUDIST_ENGINE_ONESHOT_KB", 64),
    _engine_kib("NPUDIST_ENGINE_STREAM_KB", 4096),
    _engine_kib("NPUDIST_ENGINE_DIRECT_KB", 512),
    _engine_kib("NPUDIST_ENGINE_DIRECT_MAX_KB", 32768),
    _engine_kib("NPUDIST_ENGINE_ZERO_COPY_KB", 256),
    _int("NPUDIST_ENGINE_SPIN_US", "engine", "a spin time", None, 0, 10**7, "microseconds"),
    _int("NPUDIST_ENGINE_YIELD_US", "engine", "a yield time", 50, 0, 10**7, "microseconds"),
    Variable("NPUDIST_ENGINE_DIRECT", "engine", "a copy-path choice", f"auto or a boolean ({BOOL_FORM})", "auto",
             _parse_direct, _spell_direct),
    _bool("NPUDIST_ENGINE_ZERO_COPY", "engine", True, spell=True),
    _bool("NPUDIST_ENGINE_TINY", "engine", True, spell=True),
    Variable("NPUDIST_ENGINE_NO_AVX2", "engine", "a boolean", BOOL_FORM, False, parse_bool, _spell_present),
    # Data.
    Variable("NPUDIST_DATA_CACHE", "data", "a directory", "a directory", None, _text),
)}

GROUPS = ("device", "hccl", "engine", "data")


def _raw(name: str, environ) -> str | None:
    """The value that counts: None when unset (or empty, for variables where empty means unset)."""
    raw = environ.get(name)
    if raw is None or (raw == "" and not VARIABLES[name].keep_empty):
        return None
    return raw


def read(name: str, environ=None):
    """The parsed value of ``name`` (its table default when unset); EnvVarError when malformed."""
    var = VARIABLES[name]
    raw = _raw(name, os.environ if environ is None else environ)
    if raw is None:
        return var.default
    try:
        return var.parse(raw)
    except ValueError as e:
        raise EnvVarError(name, raw, var.accepted, var.noun, str(e)) from None


def problems(groups: Iterable[str] = GROUPS, environ=None) -> list[EnvVarError]:
    """Every malformed variable of ``groups``, plus the cross-variable rule of the device runtime."""
    environ = os.environ if environ is None else environ
    found = []
    for var in VARIABLES.values():
        if var.group in groups:
            try:
                read(var.name, environ)
            except EnvVarError as e:
                found.append(e)
    if "device" in groups and not any(e.name in ("NPUDIST_DEVICE_COUNT", "ASCEND_RT_VISIBLE_DEVICES")
                                      for e in found):
        count, visible = read("NPUDIST_DEVICE_COUNT", environ), read("ASCEND_RT_VISIBLE_DEVICES", environ)
        beyond = [d for d in visible or () if d >= count]
        if beyond:
            found.append(EnvVarError(
                "ASCEND_RT_VISIBLE_DEVICES", environ["ASCEND_RT_VISIBLE_DEVICES"],
                f"ids in 0..{count - 1}", "a device list",
                f"(device {beyond[0]} does not exist: NPUDIST_DEVICE_COUNT={count})"))
    return found


class EnvironmentErrors(EnvVarError):
    """Several malformed variables at once; ``errors`` holds each one's EnvVarError."""

    def __init__(self, errors: list[EnvVarError]) -> None:
        self.errors = errors
        first = errors[0]
        self.name, self.value, self.accepted = first.name, first.value, first.accepted
        ValueError.__init__(self, f"{len(errors)} malformed environment variables:"
                            + "".join(f"\n  {e}" for e in errors))


def check(groups: Iterable[str] = GROUPS) -> None:
    """Validate the variables of ``groups`` in this process's environment and give the C++ readers the
    canonical spelling of each valid value. Raises EnvVarError (every problem found, at once)."""
    groups = tuple(groups)
    found = problems(groups)
    if len(found) == 1:
        raise found[0]
    if found:
        raise EnvironmentErrors(found)
    for var in VARIABLES.values():
        if var.group not in groups or var.spell is None:
            continue
        raw = _raw(var.name, os.environ)
        if raw is None:
            if var.name in os.environ:
                del os.environ[var.name]   # empty = unset, for the C++ reader too
            continue
        spelled = var.spell(var.parse(raw))
        if spelled is None:
            del os.environ[var.name]
        elif spelled != raw:
            os.environ[var.name] = spelled
