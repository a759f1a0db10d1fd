"""The dump configuration file of ``torch.npu.set_dump`` (ACL's ``aclmdlSetDump``), read and checked.

The file is CANN's JSON dump configuration, ``{"dump": {...}}``. Every key CANN documents for model and
single-operator dump is either honoured (:class:`DumpConfig`) or refused with a ``ValueError`` naming the
key and why; unknown keys are refused too, so a misspelt key never passes silently.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

# CANN's key -> why npudist cannot honour it.
_REFUSED = {
    "model_name": "it selects an offline model (.om) loaded with aclmdlLoad*; npudist runs every npu op as a "
                  "single operator and loads no models",
    "dump_step": "it selects iterations of a graph executed by GE (training sessions, offline models); eager npu "
                 "ops have no iteration number",
    "dump_scene": "exception and AI Core error dumps (lite_exception, aic_err_*) are written by the Ascend "
                  "hardware's exception handling, which the emulated device does not have",
    "dump_debug": "overflow dumps come from the AI Core's saturation/overflow flags, which the emulated device "
                  "(IEEE inf/nan arithmetic) does not have",
    "dump_exception": "exception dumps are written by the Ascend hardware's exception handling",
    "dump_watch": "the dump watch mode observes operator outputs being overwritten in device memory by "
                  "Ascend kernels' address checking, which the emulated device does not have",
}
_SUPPORTED = ("dump_path", "dump_mode", "dump_op_switch", "dump_list", "dump_data", "dump_level")
_CHOICES = {
    "dump_mode": ("output", "input", "all"),
    "dump_op_switch": ("on", "off"),
    "dump_data": ("tensor", "stats"),
    "dump_level": ("op", "kernel", "all"),
}
_DEFAULTS = {"dump_mode": "output", "dump_op_switch": "off", "dump_data": "tensor", "dump_level": "all"}


class DumpConfigNotFoundError(FileNotFoundError, AssertionError):
    """The dump configuration file does not exist. Also an ``AssertionError``, which torch_npu raises here."""


@dataclass(frozen=True)
class DumpConfig:
    """A checked dump configuration.

    ``layers``: the op names ``dump_list`` selects (``None``: every op). ``dump_level`` is kept for the
    record: an npu op of the emulated device runs as one kernel, so its op-level and kernel-level data are
    the same tensors and every level dumps them.
    """
    path: str
    dump_mode: str
    dump_data: str
    dump_level: str
    layers: frozenset[str] | None
    source: str

    @property
    def inputs(self) -> bool:
        return self.dump_mode in ("input", "all")

    @property
    def outputs(self) -> bool:
        return self.dump_mode in ("output", "all")


def _fail(source: str, message: str) -> ValueError:
    return ValueError(f"torch.npu.set_dump({source!r}): {message}")


def read_config(cfg_file) -> DumpConfig:
    """Parse and check ``cfg_file``; raises ``DumpConfigNotFoundError``, ``TypeError`` or ``ValueError``."""
    if not isinstance(cfg_file, (str, os.PathLike)):
        raise TypeError(f"torch.npu.set_dump: cfg_file must be a path (str or os.PathLike), got {cfg_file!r}")
    source = os.path.realpath(cfg_file)
    if not os.path.isfile(source):
        raise DumpConfigNotFoundError(f"torch.npu.set_dump: cfg_file {os.fspath(cfg_file)} path does not exists "
                                      f"(resolved to {source}); pass the path of an existing JSON dump config")
    try:
        with open(source, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise _fail(source, f"not valid JSON ({e})") from None
    if not isinstance(doc, dict) or "dump" not in doc:
        raise _fail(source, 'the file must be a JSON object with a "dump" object, e.g. {"dump": {"dump_path": '
                            '"out", "dump_op_switch": "on"}}')
    others = sorted(k for k in doc if k != "dump")
    if others:
        raise _fail(source, f"set_dump reads only the \"dump\" section; remove {others} (acl.json sections such "
                            "as profiler belong to aclInit's file)")
    dump = doc["dump"]
    if not isinstance(dump, dict):
        raise _fail(source, f'"dump" must be a JSON object, got {type(dump).__name__}')
    _check_keys(source, dump, "dump")
    values = dict(_DEFAULTS)
    for key, choices in _CHOICES.items():
        if key in dump:
            if dump[key] not in choices:
                raise _fail(source, f"{key} must be one of {list(choices)}, got {dump[key]!r}")
            values[key] = dump[key]
    if values["dump_op_switch"] == "off":
        raise _fail(source, 'dump_op_switch "off" turns single-operator dump off, and every npu op of npudist runs '
                            "as a single operator (there are no offline models to dump), so nothing would be "
                            'dumped; set "dump_op_switch": "on"')
    return DumpConfig(path=_dump_path(source, dump), dump_mode=values["dump_mode"],
                      dump_data=values["dump_data"], dump_level=values["dump_level"],
                      layers=_layers(source, dump.get("dump_list", [])), source=source)


def _check_keys(source: str, table: dict, where: str, allowed: tuple = _SUPPORTED) -> None:
    for key in table:
        if key in _REFUSED:
            raise _fail(source, f"{where}.{key} is not supported: {_REFUSED[key]}")
        if key not in allowed:
            raise _fail(source, f"unknown or unsupported key {where}.{key}; supported keys: {list(allowed)}")


def _dump_path(source: str, dump: dict) -> str:
    if "dump_path" not in dump:
        raise _fail(source, "dump_path is required: the existing directory the dump is written under")
    path = dump["dump_path"]
    if not isinstance(path, str) or not path:
        raise _fail(source, f"dump_path must be a non-empty string, got {path!r}")
    full = os.path.abspath(os.path.expanduser(os.path.expandvars(path)))
    if not os.path.isdir(full):   # CANN: the directory must exist before the dump starts
        raise _fail(source, f"dump_path {path!r} ({full}) is not an existing directory; create it first")
    if not os.access(full, os.W_OK | os.X_OK):
        raise _fail(source, f"dump_path {full} is not writable by this process")
    return full


def _layers(source: str, dump_list) -> frozenset[str] | None:
    """The op names of ``dump_list``'s ``layer`` lists; ``None`` when no entry restricts the ops."""
    if not isinstance(dump_list, list):
        raise _fail(source, f"dump_list must be a JSON list, got {type(dump_list).__name__}")
    names: set[str] = set()
    restricted = False
    for i, entry in enumerate(dump_list):
        if not isinstance(entry, dict):
            raise _fail(source, f"dump_list[{i}] must be an object such as {{\"layer\": [\"aten.mm\"]}}, "
                                f"got {entry!r}")
        _check_keys(source, entry, f"dump_list[{i}]", allowed=("layer",))
        if "layer" not in entry:   # an entry without layer selects a whole model; see model_name
            raise _fail(source, f"dump_list[{i}] has no \"layer\" list: name the ops to dump")
        layer = entry["layer"]
        if not isinstance(layer, list) or not layer or \
                not all(isinstance(n, str) and n.strip() for n in layer):
            raise _fail(source, f"dump_list[{i}].layer must be a non-empty list of op names, got {layer!r}")
        names.update(n.strip() for n in layer)
        restricted = True
    if restricted:
        known = _op_aliases()
        unknown = sorted(n for n in names if n not in known)
        if unknown:   # a misspelt name would select nothing and the dump would stay silently empty
            raise _fail(source, f"dump_list layer names {unknown} name no registered op; name an op by its type "
                                "(addmm), packet (aten.addmm), overload (aten.addmm.default) or dump file op name "
                                "(aten_addmm_default)")
    return frozenset(names) if restricted else None


def op_aliases(namespace: str, name: str, overload: str) -> set[str]:
    """The names a dump_list layer may use for an op: its type, dump file op name, packet and overload."""
    overload = overload or "default"
    return {name, f"{namespace}_{name}_{overload}", f"{namespace}.{name}", f"{namespace}.{name}.{overload}"}


def _op_aliases() -> set[str]:
    import torch  # noqa: PLC0415 - the config reader itself needs no torch

    known: set[str] = set()
    for qualified in torch._C._dispatch_get_all_op_names():   # "aten::add.Tensor", "aten::addmm"
        namespace, _, rest = qualified.partition("::")
        name, _, overload = rest.partition(".")
        known |= op_aliases(namespace, name, overload)
    return known
