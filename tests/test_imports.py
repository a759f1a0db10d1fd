"""Import structure: `import torch` registers npudist (autoload), torch-free layers load no torch and no C++
extension, no two npudist subpackages import each other, no two npudist modules import each other (not even
through a function-local import), and the layers below the model specs name no model attribute.

`python tests/test_imports.py` draws the module graph as floors: floor 0 imports no other npudist module,
every module sits one floor above the highest module it imports, so every arrow points down."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(REPO, "npudist")

pytestmark = pytest.mark.timeout(180)


def _python(code: str, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("TORCH_DEVICE_BACKEND_AUTOLOAD",
                                                           "NPUDIST_DEVICE_COUNT")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=150,
                          cwd=REPO)


def test_import_torch_alone_brings_npu_and_hccl():
    r = _python("import torch, torch.distributed as dist\n"
                "print(torch.npu.device_count(), torch.ones(2, device='npu').sum().item(), "
                "dist.is_backend_available('hccl'))")
    assert r.returncode == 0, r.stderr
    count, total, hccl = r.stdout.split()
    assert int(count) >= 1 and float(total) == 2.0 and hccl == "True"


def test_device_module_imported_before_torch_registers_everything_without_warning():
    # `from npudist.device import X` first imports torch from inside the device package, whose autoload then
    # cannot register the operators yet ("npu" is not a device name until the package renames PrivateUse1): the
    # package finishes registration as its last step, and nothing warns.
    r = _python("import warnings\nwarnings.simplefilter('error')\n"
                "from npudist.device import sanitizer\n"
                "import torch, torch.distributed as dist\n"
                "print(torch.ops.npu.npu_swiglu(torch.ones(2, 4, device='npu')).shape[-1], "
                "dist.is_backend_available('hccl'))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "True"], r.stdout
    assert "not registered" not in r.stderr, r.stderr


def test_autoload_switch_off_then_import_or_explicit_register():
    # With autoload off, `import npudist` after torch registers (scripts that say `import torch, npudist` keep
    # working); imported before torch it cannot, and `npudist.register()` does it explicitly.
    r = _python("import sys, torch\n"
                "print(hasattr(torch, 'npu'), 'npudist' in sys.modules)\n"
                "import npudist\n"
                "print(torch.npu.device_count() >= 1)", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "True"]
    r = _python("import npudist, torch\n"
                "print(hasattr(torch, 'npu'))\n"
                "npudist.register()\n"
                "print(torch.npu.device_count() >= 1)", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


def test_malformed_device_variable_leaves_torch_importable_and_npu_use_raises_its_error():
    # A malformed device setting makes device registration raise; `import torch` must still work, warn with the
    # variable's error, and every npu use must raise that error (not torch's "Expected one of cpu, cuda, ...").
    r = _python("import warnings\nwarnings.simplefilter('always')\nimport torch\n"
                "print(torch.ones(3).sum().item(), torch.npu.is_available())\n"
                "torch.ones(4, device='npu')", NPUDIST_DEVICE_COUNT="abc")
    assert r.returncode != 0
    assert r.stdout.split() == ["3.0", "False"]
    assert "RuntimeWarning: npudist: NPUDIST_DEVICE_COUNT='abc' is not a device count" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("npudist.env.EnvVarError: NPUDIST_DEVICE_COUNT='abc'")
    r = _python("import npudist\nnpudist.register()", NPUDIST_DEVICE_COUNT="abc", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode != 0 and "NPUDIST_DEVICE_COUNT" in r.stderr


def test_torch_free_layers_load_no_torch_and_no_extension():
    r = _python("import sys\nimport npudist, npudist.plan, npudist.models, npudist.cli\n"
                "from npudist.plan.check import check_plan\n"
                "check_plan('examples/plans/fsdp_tp.yaml', 4)\n"
                "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') "
                "or m.endswith('._C')))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --- the import graph, from source --------------------------------------------------------------------

def _unit(path: str) -> str | None:
    """Top-level unit of npudist a source file belongs to (subpackage or module); None for the root."""
    rel = os.path.relpath(path, PKG).split(os.sep)
    if rel == ["__init__.py"]:
        return None
    return rel[0][:-3] if rel[0].endswith(".py") else rel[0]


def _units() -> set[str]:
    return {n[:-3] if n.endswith(".py") else n for n in os.listdir(PKG)
            if (n.endswith(".py") and n != "__init__.py") or os.path.isfile(os.path.join(PKG, n, "__init__.py"))}


def _imported_units(path: str, units: set[str]) -> set[str]:
    """npudist units a file imports, at any level (function-local imports count: they are still edges)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    rel = os.path.relpath(path, REPO)[:-3].split(os.sep)
    package = rel[:-1] if rel[-1] != "__init__" else rel[:-1]
    if rel[-1] == "__init__":
        package = rel[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "npudist" and len(parts) > 1 and parts[1] in units:
                out.add(parts[1])
    return out


def import_graph() -> dict[str, set[str]]:
    units, graph = _units(), {}
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                unit = _unit(path)
                if unit is not None:
                    graph.setdefault(unit, set()).update(_imported_units(path, units) - {unit})
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_import_graph_detector_sees_edges():
    graph = import_graph()
    assert "models" in graph["parallelize"] and "models" in graph["plan"] and "plan" in graph["mesh"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles_between_npudist_units():
    cycle = _cycle(import_graph())
    assert cycle is None, f"npudist units import each other: {' -> '.join(cycle)}"


# --- the import graph of modules, from source -------------------------------------------------------

# Imports allowed to point back up (they close a circle): (importer, imported) -> why. Only a registration
# belongs here, i.e. a lower module that must call into a higher one which registers itself with it, and
# the reason says where that is documented. There is none today.
DOCUMENTED_BACK_EDGES: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, str]:
    """Every npudist module (dotted name -> file), C++ extensions (``npudist._C``) included as leaves."""
    out = {}
    for root, dirs, files in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py") or (f.endswith(".so") and f.startswith("_C.")):
                rel = os.path.relpath(os.path.join(root, f), REPO).split(os.sep)
                rel[-1] = rel[-1].split(".")[0]
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(root, f)
    return out


def _module_imports(name: str, path: str, modules: dict[str, str]) -> list[tuple[str, int, bool]]:
    """(imported module, line, function-local) for every npudist import of one module. ``from P import x``
    is an edge to ``P.x`` when that is a module, else to ``P``."""
    if not path.endswith(".py"):
        return []
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
    out = []

    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                targets = [known(a.name) for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = package[:len(package) - child.level + 1] if child.level else []
                mod = ".".join(base + ([child.module] if child.module else []))
                targets = [known(f"{mod}.{a.name}") if f"{mod}.{a.name}" in modules else known(mod)
                           for a in child.names]
            else:
                targets = []
            out.extend((t, child.lineno, local) for t in targets if t and t != name)
            visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return out


def module_graph(documented_back_edges: bool = False) -> dict[str, set[str]]:
    """Module -> the npudist modules it imports, at module level or inside a function; without the
    documented back edges unless asked for."""
    modules = _modules()
    return {name: {t for t, _, _ in _module_imports(name, path, modules)
                   if documented_back_edges or (name, t) not in DOCUMENTED_BACK_EDGES}
            for name, path in modules.items()}


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Floor of each module in an acyclic graph: 0 if it imports nothing, else one above its highest import."""
    memo: dict[str, int] = {}

    def floor(n: str) -> int:
        if n not in memo:
            memo[n] = 1 + max((floor(m) for m in graph.get(n, ())), default=-1)
        return memo[n]

    return {n: floor(n) for n in graph}


def test_module_graph_detector_sees_function_local_and_extension_imports():
    modules = _modules()
    edges = {(t, local) for t, _, local in _module_imports("npudist", modules["npudist"], modules)}
    assert ("npudist.device", True) in edges          # register(): a function-local import
    core = _module_imports("npudist.device.core", modules["npudist.device.core"], modules)
    assert ("npudist._C", False) in {(t, local) for t, _, local in core}   # `from npudist import _C`
    assert "npudist.launch.options" in module_graph()["npudist.launch.job"]   # `from .options import ...`


def test_no_import_cycles_between_npudist_modules():
    graph = module_graph()
    cycle = _cycle(graph)
    assert cycle is None, ("npudist modules import each other (an arrow back up; function-local imports "
                           f"count): {' -> '.join(cycle)}")
    unused = set(DOCUMENTED_BACK_EDGES) - {(a, b) for a, bs in module_graph(True).items() for b in bs}
    assert not unused, f"documented back edges that no longer exist: {sorted(unused)}"


MODEL_NAMES = ("tok_embeddings", "layers", "norm", "output", "lm_head", "embed_tokens")
MODEL_FREE = ("fsdp", "tp", "pp", "plan", "mesh")


def _model_name_uses(path: str) -> list[str]:
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    pattern = re.compile(r"^(model\.)?(%s)(\.|$)" % "|".join(MODEL_NAMES))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in MODEL_NAMES + ("args",):
            hits.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value):
            hits.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: {node.value!r}")
    return hits


def test_parallel_and_plan_layers_name_no_model_attribute():
    hits = []
    for unit in MODEL_FREE:
        for root, _, files in os.walk(os.path.join(PKG, unit)):
            hits += [h for f in files if f.endswith(".py") for h in _model_name_uses(os.path.join(root, f))]
    assert not hits, "model attributes named outside npudist.models:\n" + "\n".join(hits)


if __name__ == "__main__":
    graph = module_graph()
    if _cycle(graph):
        sys.exit("circle: " + " -> ".join(_cycle(graph)))
    by_floor: dict[int, list[str]] = {}
    for module, f in floors(graph).items():
        by_floor.setdefault(f, []).append(module)
    for f in sorted(by_floor, reverse=True):
        print(f"floor {f}:")
        for module in sorted(by_floor[f]):
            print(f"  {module} -> {', '.join(sorted(graph[module])) or '-'}")
