"""torchair's ``CompilerConfig`` as npudist reads it (docs/graphs.md, "torchair").

Scripts written for torch_npu's torchair set options by assignment (``config.mode = "npugraph_ex"``,
``config.debug.aclgraph.disable_reinplace_input_mutated_ops_pass = True``). This config accepts every assignment
into torchair's sections and keeps what was set; :func:`honored_options` turns the options that mean something here
into ``npugraph_ex`` options and reports the others once per process with a warning naming them. Reading an
option that was never set raises AttributeError: only what was set is kept, not torchair's full default table.
Values are plain (``config.mode`` is the string; torchair wraps them in option objects with ``.value``).
"""
from __future__ import annotations

import warnings

MODES = ("max-autotune", "reduce-overhead", "npugraph_ex")
_SECTIONS = {
    "debug": ("graph_dump", "data_dump", "fx_summary", "aclgraph"),
    "aoe_config": (), "export": ("experimental",), "dump_config": (), "fusion_config": (),
    "experimental_config": ("aclgraph",), "inference_config": (), "ge_config": (), "aclgraph_config": (),
    "npugraphex_config": (),
}
_TOP_LEVEL = ("post_grad_custom_pre_pass", "post_grad_custom_post_pass")

# Options that switch npugraph_ex's passes: (option path, npugraph_ex option, value of the path that turns it off).
_PASS_SWITCHES = (
    ("debug.aclgraph.disable_reinplace_input_mutated_ops_pass", "input_inplace_pass", True),
    ("npugraphex_config.input_inplace_pass", "input_inplace_pass", False),
    ("experimental_config.remove_noop_ops", "remove_noop_ops", False),
    ("npugraphex_config.remove_noop_ops", "remove_noop_ops", False),
    ("experimental_config.pattern_fusion_pass", "pattern_fusion_pass", False),
    ("npugraphex_config.pattern_fusion_pass", "pattern_fusion_pass", False),
)
_reported: set[str] = set()


class _Section:
    """One of torchair's option groups: assignments are recorded on the root config by dotted path."""

    def __init__(self, root, path: str, children=()):
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_children", {c: _Section(root, f"{path}.{c}") for c in children})

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._children:
            return self._children[name]
        key = f"{self._path}.{name}"
        if key in self._root._set:
            return self._root._set[key]
        raise AttributeError(f"CompilerConfig option {key} was not set (npudist keeps only the options set)")

    def __setattr__(self, name: str, value) -> None:
        if name in self._children:
            raise TypeError(f"CompilerConfig: {self._path}.{name} is an option group; set its options instead")
        self._root._set[f"{self._path}.{name}"] = value


class CompilerConfig:
    """torchair's compiler configuration: ``mode`` selects the backend, other options are accepted."""

    def __init__(self):
        object.__setattr__(self, "_set", {})
        object.__setattr__(self, "_mode", "max-autotune")
        for name, children in _SECTIONS.items():
            object.__setattr__(self, name, _Section(self, name, children))

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        value = getattr(value, "value", value)
        if value not in MODES:
            raise ValueError(f"CompilerConfig.mode must be one of {list(MODES)}, got {value!r}")
        object.__setattr__(self, "_mode", value)

    def __setattr__(self, name: str, value) -> None:
        if name == "mode":
            CompilerConfig.mode.fset(self, value)
        elif name in _SECTIONS:
            raise TypeError(f"CompilerConfig: {name} is an option group; set its options instead")
        elif name in _TOP_LEVEL:
            self._set[name] = value
        else:
            raise AttributeError(f"CompilerConfig has no option {name!r}; options: mode, "
                                 f"{', '.join(_TOP_LEVEL)} and the groups {', '.join(_SECTIONS)}")

    def __getattr__(self, name: str):
        if name in _TOP_LEVEL:
            return self._set.get(name)
        raise AttributeError(f"CompilerConfig has no option {name!r}")

    def options_set(self) -> dict:
        """The options assigned so far, by dotted path (``mode`` excluded)."""
        return dict(self._set)


def honored_options(config: CompilerConfig) -> dict:
    """npugraph_ex options from ``config`` (empty for the other modes); warns once per name about the options
    that have no effect in npudist."""
    options, used = {}, set()
    if config.mode == "npugraph_ex":
        for path, option, off in _PASS_SWITCHES:
            if path in config._set:
                used.add(path)
                if bool(config._set[path]) == off:
                    options[option] = False
    ignored = sorted(set(config._set) - used - _reported)
    if ignored:
        _reported.update(ignored)
        warnings.warn(f"torchair CompilerConfig (mode {config.mode!r}): options accepted but without effect in "
                      f"npudist: {', '.join(ignored)} (docs/graphs.md, torchair)", stacklevel=3)
    return options
