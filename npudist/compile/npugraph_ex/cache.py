"""``cache_compile``: a compiled function saved per rank, loaded on later process starts without Dynamo.

The first call exports the function (``torch.export``, non-strict, ATen after ``run_decompositions``) with its
call's inputs, saves the program (``torch.export.save``) and a JSON description beside it, and runs the program
through npugraph_ex's passes and NPUGraph capture. A later process start finds the file, checks the description
against the current call (format, torch and npudist versions, the function and model fingerprint, the rank
layout, parameter names and shapes, input shapes and dtypes) and, if everything matches, loads the program and
runs it the same way: no Dynamo trace, no guards. A mismatch is reported (a warning naming each differing field)
and the cache rebuilt. The loaded program computes with the live model's parameters and buffers, not the
values saved at export. Inference only (the graph is not differentiated); keyword arguments are refused.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import types
import warnings
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from npudist.compile.npugraph_ex.capture import COUNTERS

FORMAT = 1
FILE = "compiled_program.pt2"
META = "cache.json"


class _Wrapper(torch.nn.Module):
    """``func`` as a module to export; a method's model is a submodule, so its weights are lifted by name."""

    def __init__(self, func):
        super().__init__()
        self.model = func.__self__ if isinstance(func, types.MethodType) else None
        self.fn = func

    def forward(self, *args):
        return self.fn(*args)


def _fingerprint(func) -> tuple[str, str]:
    if isinstance(func, types.MethodType):
        model = func.__self__
        return model.__class__.__name__, repr(model) + inspect.getsource(func.__func__)
    return func.__name__, inspect.getsource(func)


def _rank_layout(global_rank, tp_rank, pp_rank) -> dict:
    import torch.distributed as dist

    layout = {"world_size": 1, "global_rank": global_rank, "tp_rank": tp_rank, "pp_rank": pp_rank}
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        layout["world_size"] = dist.get_world_size()
        layout["global_rank"] = dist.get_rank() if global_rank is None else global_rank
    return layout


def _tensor_specs(named) -> dict:
    return {name: [list(t.shape), str(t.dtype)] for name, t in named}


def cache_path(func, *, dynamic: bool, cache_dir, layout: dict) -> Path:
    """Where ``func``'s program is saved: torch_npu's layout (class, trace mode, fingerprint hash / ranks / name)."""
    cls_name, constraint = _fingerprint(func)
    digest = hashlib.md5(constraint.encode(), usedforsecurity=False).hexdigest()
    ranks = []
    if layout["world_size"] > 1:
        ranks.append(f"world{layout['world_size']}global_rank{layout['global_rank']}")
    ranks += [f"{k}{layout[k]}" for k in ("tp_rank", "pp_rank") if layout[k] is not None]
    root = Path(cache_dir or os.environ.get("TORCHAIR_CACHE_HOME", Path.cwd() / ".torchair_cache"))
    tag = "dynamic" if dynamic else "static"
    return root / f"{cls_name}_{tag}_npugraphexcache_{digest}" / "_".join(ranks) / func.__name__ / FILE


def _npudist_version() -> str:
    # From the installed distribution, not `import npudist`: this package sits below npudist's top module.
    from importlib import metadata
    try:
        return metadata.version("npudist")
    except metadata.PackageNotFoundError:
        return "unknown"


def _describe(func, wrapper, args, dynamic: bool, layout: dict) -> dict:
    return {"format": FORMAT, "torch": torch.__version__, "npudist": _npudist_version(),
            "function": getattr(func, "__qualname__", func.__name__),
            "fingerprint": hashlib.md5(_fingerprint(func)[1].encode(), usedforsecurity=False).hexdigest(),
            "dynamic": dynamic, "ranks": layout,
            "state": _tensor_specs(list(wrapper.named_parameters()) + list(wrapper.named_buffers())),
            "inputs": _tensor_specs((str(i), a) for i, a in enumerate(args))}


def _differences(saved: dict, now: dict) -> list[str]:
    fields = [k for k in now if k != "inputs" or not now["dynamic"]]
    diffs = [f"{k}: saved {saved.get(k)!r}, now {now[k]!r}" for k in fields if saved.get(k) != now[k]]
    if now["dynamic"] and [len(s[0]) for s in saved.get("inputs", {}).values()] != \
            [len(s[0]) for s in now["inputs"].values()]:
        diffs.append(f"inputs: saved {saved.get('inputs')!r}, now {now['inputs']!r}")
    return diffs


def _export(wrapper, args, dynamic: bool):
    dims = None
    if dynamic:  # forward(*args): one spec for the varargs tuple
        dims = (tuple({d: torch.export.Dim.AUTO for d in range(a.dim())} if isinstance(a, torch.Tensor) else None
                      for a in args),)
    return torch.export.export(wrapper, tuple(args), dynamic_shapes=dims, strict=False).run_decompositions({})


def _bind_live_state(gm: torch.nn.Module, wrapper: torch.nn.Module) -> None:
    """Point the program's parameters and buffers at the live model's tensors (same names)."""
    for name, tensor in list(wrapper.named_parameters()) + list(wrapper.named_buffers()):
        owner_name, _, leaf = name.rpartition(".")
        owner = gm.get_submodule(owner_name)
        if leaf in owner._parameters:
            owner._parameters[leaf] = tensor
        else:
            owner._buffers[leaf] = tensor


def _runner(ep, wrapper):
    from npudist.compile.npugraph_ex import backend, passes
    from npudist.compile.npugraph_ex.capture import capture_graph

    gm = ep.module()
    _bind_live_state(gm, wrapper)
    # The export's input checks (shapes it specialized, dynamic ranges). Called on every call: the passes' dead
    # code elimination may drop the graph node that calls them (it has no users).
    guards = getattr(gm, "_guards_fn", None)
    backend.optimize(gm, backend.OPTIONS)
    run = capture_graph(gm, (), passes.mutated_inputs(gm))
    out_spec = ep.call_spec.out_spec

    def call(*args):
        if guards is not None:
            try:
                guards(*args)
            except AssertionError as e:
                raise ValueError(f"cache_compile: these inputs do not fit the compiled program ({e}); shapes "
                                 "other than the first call's need dynamic=True, within what the export allowed") from e
        flat = run(list(args))
        return torch.utils._pytree.tree_unflatten(list(flat), out_spec)
    return call


class CachedCompiled:
    """The callable ``cache_compile`` returns: loads or builds the program on its first call."""

    def __init__(self, func, *, dynamic: bool, cache_dir, global_rank, tp_rank, pp_rank):
        if not callable(func):
            raise TypeError(f"cache_compile: expected a function or a bound method, got {type(func).__name__}")
        self.func, self.dynamic, self.cache_dir = func, dynamic, cache_dir
        self.ranks = (global_rank, tp_rank, pp_rank)
        self.compiled = None
        self.path = None

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise ValueError(f"cache_compile: keyword arguments are not supported ({sorted(kwargs)}); pass them "
                             "positionally")
        if self.compiled is None:
            self.compiled = self._load_or_build(args)
        return self.compiled(*args)

    def _load_or_build(self, args):
        layout = _rank_layout(*self.ranks)
        self.path = cache_path(self.func, dynamic=self.dynamic, cache_dir=self.cache_dir, layout=layout)
        wrapper = _Wrapper(self.func)
        now = _describe(self.func, wrapper, args, self.dynamic, layout)
        meta = self.path.with_name(META)
        if self.path.exists() and meta.exists():
            saved = json.loads(meta.read_text())
            diffs = _differences(saved, now)
            if not diffs:
                counters[COUNTERS]["cache_loads"] += 1
                return _runner(torch.export.load(self.path), wrapper)
            warnings.warn(f"cache_compile: the cache {self.path} does not match this call ({'; '.join(diffs)}); "
                          "rebuilding it", stacklevel=3)
            counters[COUNTERS]["cache_rebuilds"] += 1
        ep = _export(wrapper, args, self.dynamic)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.export.save(ep, self.path)
        meta.write_text(json.dumps(now, indent=1))
        counters[COUNTERS]["cache_saves"] += 1
        return _runner(ep, wrapper)


def readable_cache(cache_bin, print_output: bool = True, file=None) -> str:
    """What the cache at ``cache_bin`` (the program file, or its directory) holds: its description and graph."""
    path = Path(cache_bin)
    if path.is_dir():
        path = path / FILE
    if not path.exists() or not path.with_name(META).exists():
        raise FileNotFoundError(f"readable_cache: no npugraph_ex cache at {path} (expected {FILE} and {META})")
    meta = json.loads(path.with_name(META).read_text())
    ep = torch.export.load(path)
    text = "\n".join([f"{k}: {v}" for k, v in meta.items()] + ["graph:", str(ep.graph_module.code).strip()])
    if file is not None:
        Path(file).write_text(text + "\n")
    if print_output:
        print(text)
    return text
