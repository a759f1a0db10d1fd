#!/usr/bin/env python3
"""Reading a torch_npu wheel as data: its public names with their signatures, its documented operators and the
names of its C extension, from the wheel's Python sources (parsed with ``ast``, never imported), its native
function schemas and libtorch_npu.so's strings. Used by ``scripts/torch_npu_surface.py extract``."""
from __future__ import annotations

import ast
import re
import tempfile
import warnings
import zipfile
from pathlib import Path

# Modules whose ``__all__`` is the public surface (issue: torch_npu.npu, torch_npu, distributed, contrib,
# profiler, optim, utils).
ALL_MODULES = ("torch_npu.npu", "torch_npu", "torch_npu.distributed", "torch_npu.contrib", "torch_npu.profiler",
               "torch_npu.optim", "torch_npu.utils")

# Names of the C extension that clients call (torchtitan-npu's mesh builder and async TP, the MC2 operators'
# ``hcom``): they have no Python source, so their parameter names are read from libtorch_npu.so's strings
# (pybind11 keeps py::arg names there) and checked to be present.
C_NAMES = {
    "ProcessGroupHCCL": {"kind": "class", "params": [["store", "positional"], ["rank", "positional"],
                                                      ["size", "positional"], ["options", "positional"]],
                         "strings": ["ProcessGroupHCCL"]},
    "ProcessGroupHCCL.Options": {"kind": "class", "params": [],
                                 "attributes": ["hccl_config", "is_high_priority_stream", "global_ranks_in_group",
                                                "group_id", "_timeout"],
                                 "strings": ["hccl_config", "is_high_priority_stream", "global_ranks_in_group"]},
    "ProcessGroupHCCL.get_hccl_comm_name": {"kind": "method",
                                            "params": [["rankid", "positional"], ["init_comm", "positional", "True"]],
                                            "strings": ["get_hccl_comm_name", "rankid", "init_comm"]},
}


# ---------------------------------------------------------------------------------------------------------
# Reading the wheel


class Wheel:
    """The Python sources of an unpacked torch_npu wheel, parsed on demand."""

    def __init__(self, root: Path):
        self.root = root
        self._trees: dict[str, ast.Module | None] = {}

    def path_of(self, module: str) -> Path | None:
        rel = Path(*module.split("."))
        for cand in (self.root / rel / "__init__.py", self.root / rel.with_suffix(".py")):
            if cand.is_file():
                return cand
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.path_of(module)
            with warnings.catch_warnings():   # the wheel's sources have invalid escapes in docstrings
                warnings.simplefilter("ignore")
                self._trees[module] = ast.parse(path.read_text(encoding="utf-8")) if path else None
        return self._trees[module]

    def is_package(self, module: str) -> bool:
        path = self.path_of(module)
        return path is not None and path.name == "__init__.py"

    def all_of(self, module: str) -> list[str]:
        tree = self.tree(module)
        if tree is None:
            raise SystemExit(f"{module}: not found under {self.root}")
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                return list(ast.literal_eval(node.value))
        raise SystemExit(f"{module}: no literal __all__")

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".")
        if not self.is_package(module):
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def resolve(self, module: str, name: str, depth: int = 0) -> dict:
        """Where ``module.name`` is defined and its signature: follows ``from x import`` chains in the wheel."""
        tree = self.tree(module)
        if tree is None or depth > 12:
            return {"kind": "unresolved", "where": module}
        found = None
        for node in tree.body:   # the last binding at module level wins, as at run time
            hit = self._binding(module, node, name, depth)
            if hit is not None:
                found = hit
        if found is None and module == "torch_npu":
            target = self.lazy_exports().get(name)
            if target is not None:
                return self.resolve(target[0], target[1], depth + 1)
        return found or {"kind": "unresolved", "where": module}

    def lazy_exports(self) -> dict[str, tuple[str, str]]:
        """torch_npu's top-level names bound at import from a table (name -> (module, attribute))."""
        tree = self.tree("torch_npu._init.core._exports")
        for node in tree.body if tree else ():
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                table = ast.literal_eval(node.value)
                if all(isinstance(v, tuple) and len(v) == 2 for v in table.values()):
                    return table
        return {}

    def _binding(self, module: str, node: ast.stmt, name: str, depth: int) -> dict | None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return {"kind": "function", "where": module, "params": params_of(node.args)}
        if isinstance(node, ast.ClassDef) and node.name == name:
            init = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
            out = {"kind": "class", "where": module}
            if init is not None:
                out["params"] = params_of(init.args)[1:]
            return out
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return {"kind": "value", "where": module, "value": ast.unparse(node.value)[:200]}
        if isinstance(node, ast.ImportFrom):
            source = self.absolute(module, node)
            for alias in node.names:
                if alias.name == "*":
                    if self.tree(source) is not None and name in self._star_names(source):
                        return self.resolve(source, name, depth + 1)
                elif (alias.asname or alias.name) == name:
                    if self.tree(source) is not None:
                        return self.resolve(source, alias.name, depth + 1)
                    if self.path_of(source + "." + alias.name) is not None:
                        return {"kind": "module", "where": source + "." + alias.name}
                    return {"kind": "external", "where": f"{source}.{alias.name}"}
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name:
                    return {"kind": "module", "where": alias.name}
        if isinstance(node, (ast.If, ast.Try)):
            for sub in node.body:
                hit = self._binding(module, sub, name, depth)
                if hit is not None:
                    return hit
        return None

    def _star_names(self, module: str) -> list[str]:
        try:
            return self.all_of(module)
        except SystemExit:
            tree = self.tree(module)
            return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                    and not n.name.startswith("_")]


def params_of(args: ast.arguments) -> list[list[str]]:
    """[name, kind] or [name, kind, default source] per parameter, in order (inspect's kinds)."""
    out: list[list[str]] = []
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (a, d) in enumerate(zip(positional, defaults)):
        kind = "positional_only" if i < len(args.posonlyargs) else "positional"
        out.append([a.arg, kind] + ([ast.unparse(d)] if d is not None else []))
    if args.vararg:
        out.append([args.vararg.arg, "var_positional"])
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append([a.arg, "keyword_only"] + ([ast.unparse(d)] if d is not None else []))
    if args.kwarg:
        out.append([args.kwarg.arg, "var_keyword"])
    return out


# Documented operators ----------------------------------------------------------------------------------

def documented_operators(wheel: Wheel) -> list[dict]:
    """Every name ``_op_plugin_docs.py`` documents, with its schemas from the wheel's native-functions yaml."""
    tree = wheel.tree("torch_npu._op_plugin_docs")
    schemas = native_schemas(wheel.root / "torch_npu" / "csrc" / "aten")
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_add_torch_npu_docstr"
                and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)):
            name = node.args[0].value
            if "." in name:   # `op.out`: an overload of a documented operator, not a name of its own
                continue
            names.setdefault(name, documented_prototype(name, node.args[1].value))
    out = []
    for name in sorted(names):
        entry = {"name": name, "kind": "operator"}
        if name in schemas:
            entry["schemas"] = schemas[name]
        if names[name]:
            entry["documented"] = names[name]
        out.append(entry)
    return out


def native_schemas(aten_dir: Path) -> dict[str, list[str]]:
    """name -> its ``func:`` schemas (every overload) from npu_native_functions*.yaml (read as text)."""
    out: dict[str, list[str]] = {}
    for path in sorted(aten_dir.glob("npu_native_functions*.yaml")):
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"\s*-?\s*func:\s*(.+)$", line)
            if m:
                schema = m.group(1).strip()
                base = schema.split("(", 1)[0].split(".", 1)[0]
                out.setdefault(base, []).append(schema)
    return out


def documented_prototype(name: str, doc: str) -> str:
    """The ``torch_npu.<name>(...)`` prototype line of an operator's documentation, joined if it wraps."""
    text = doc.replace("torch_npu. ", "torch_npu.")
    start = text.find(f"torch_npu.{name}(")
    if start < 0:
        return ""
    depth, end = 0, start
    for end in range(start, min(len(text), start + 4000)):
        if text[end] == "(":
            depth += 1
        elif text[end] == ")":
            depth -= 1
            if depth == 0:
                break
    proto = text[start:end + 1]
    rest = text[end + 1:end + 200].split("\n", 1)[0]
    if rest.strip().startswith("->"):
        proto += " " + rest.strip()
    return " ".join(proto.split())


def extract(wheel_arg: str) -> dict:
    source = Path(wheel_arg)
    if source.is_file() and source.suffix == ".whl":
        tmp = Path(tempfile.mkdtemp(prefix="torch_npu_wheel_"))
        with zipfile.ZipFile(source) as z:
            z.extractall(tmp, [n for n in z.namelist() if n.endswith((".py", ".yaml", "libtorch_npu.so", "METADATA"))])
        source = tmp
    if not (source / "torch_npu" / "__init__.py").is_file():
        raise SystemExit(f"{wheel_arg}: not a torch_npu wheel or unpacked wheel (no torch_npu/__init__.py)")
    wheel = Wheel(source)
    version = ""
    for meta in source.glob("torch_npu-*.dist-info/METADATA"):
        m = re.search(r"^Version: (\S+)", meta.read_text(encoding="utf-8"), re.M)
        version = m.group(1) if m else ""
    sections = {}
    for module in ALL_MODULES:
        entries = []
        for name in wheel.all_of(module):
            entry = {"name": name}
            entry.update(wheel.resolve(module, name))
            entries.append(entry)
        sections[module] = entries
    sections["operators"] = documented_operators(wheel)
    sections["torch_npu._C._distributed_c10d"] = c_names(source)
    return {"torch_npu_version": version, "sections": sections}


def c_names(source: Path) -> list[dict]:
    lib = source / "torch_npu" / "lib" / "libtorch_npu.so"
    blob = lib.read_bytes() if lib.is_file() else b""
    out = []
    for name, spec in C_NAMES.items():
        missing = [s for s in spec["strings"] if s.encode() not in blob]
        if missing:
            raise SystemExit(f"{lib}: {name}: strings {missing} not found; the binding changed, update C_NAMES")
        entry = {"name": name, "kind": spec["kind"], "where": "torch_npu._C._distributed_c10d",
                 "params": spec["params"]}
        if "attributes" in spec:
            entry["attributes"] = spec["attributes"]
        out.append(entry)
    return out
