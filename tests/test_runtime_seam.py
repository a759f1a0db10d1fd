"""The seams (docs/backends.md). Device runtime: the aten glue and the caching allocator reach the runtime
only through its C ABI header, the runtime does not depend on the allocator, and host-memory assumptions are
marked with `HOST-MEMORY:` only in the emulated runtime, the CPU-alias primitives and the op path, and the rooms
include and call each other without a circle. Communicator: its interface names
no type of the shared-memory engine, only the shm adapter and the factory include the engine, host access to
npu memory in hccl is marked only in the communicators, and the C tables reach hccl as named capsules.
Reads sources (the capsule test imports the extensions); builds nothing."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "device_core")
C_ABI = "npudist/runtime_c_api.h"
# device_core's rooms and what each is to the seam. The runtime (runtime/) is torch-free and reached only through
# the C ABI; the allocator's core is torch-free too and its torch adapter reaches the runtime through the C ABI;
# every other room is glue over the C ABI. A new room must be classified here.
ROOMS = {"runtime": "runtime", "allocator": "allocator", "launch": "glue", "op_path": "glue", "aten": "glue",
         "graph": "glue", "profiler": "glue", "": "glue"}


def _room_files(room: str) -> list[str]:
    folder = os.path.join(CORE, room)
    return sorted(os.path.join(room, n) if room else n for n in os.listdir(folder) if n.endswith((".cpp", ".h")))


RUNTIME = [f for r, kind in ROOMS.items() if kind == "runtime" for f in _room_files(r)]
ALLOCATOR = [f for r, kind in ROOMS.items() if kind == "allocator" for f in _room_files(r)]
GLUE = [f for r, kind in ROOMS.items() if kind == "glue" for f in _room_files(r)]
# Headers that other rooms may include: the C ABI, the glue's helpers, each room's interface.
PUBLIC = {C_ABI, "npu_runtime.h", "npu_tensor.h", "op_path/op_path.h", "op_path/warning_probe.h",
          "allocator/npu_allocator.h", "allocator/host_allocator.h", "profiler/profiler.h", "graph/graph_capture.h",
          "launch/launch.h", "include/npudist/profiler_c_api.h", "include/npudist/launch_c_api.h"}
# Allowed to say HOST-MEMORY (everything else reaches memory through the runtime table).
HOST_MEMORY_FILES = {"runtime/runtime_memory.cpp", "runtime/runtime_c_api.cpp", "op_path/fallback.cpp",
                     "npu_tensor.cpp", "aten/copy.cpp"}

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _read(rel: str) -> str:
    with open(os.path.join(CORE, rel)) as f:
        return f.read()


def _resolve(including: str, name: str) -> str:
    """The device_core-relative path of a quoted include, as the compiler finds it."""
    for base in (os.path.dirname(including), "", "include"):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.exists(os.path.join(CORE, cand)):
            return C_ABI if cand == os.path.join("include", C_ABI) else cand
    raise AssertionError(f"{including}: #include \"{name}\" does not resolve inside device_core")


def local_includes(rel: str) -> set[str]:
    return {_resolve(rel, n) for n in _INCLUDE.findall(_read(rel))}


def transitive_includes(rel: str) -> set[str]:
    seen, todo = set(), [rel]
    while todo:
        for inc in local_includes(todo.pop()):
            if inc not in seen and inc != C_ABI:
                seen.add(inc)
                todo.append(inc)
            seen.add(inc)
    return seen


def test_every_device_core_source_is_in_a_classified_room():
    present = set()
    for dirpath, _, names in os.walk(CORE):
        rel_dir = os.path.relpath(dirpath, CORE)
        if rel_dir == "include" or rel_dir.startswith("include" + os.sep):
            continue  # the C ABI headers: checked as C below
        present |= {os.path.normpath(os.path.join(rel_dir, n)) for n in names if n.endswith((".cpp", ".h"))}
    listed = set(GLUE) | set(RUNTIME) | set(ALLOCATOR)
    assert present == listed, f"device_core files outside the classified rooms: {sorted(present - listed)}; " \
                              "put them in a room of ROOMS in this test (or add the room)"


@pytest.mark.parametrize("rel", GLUE + ALLOCATOR)
def test_glue_and_allocator_use_only_the_c_abi(rel):
    # A room's private headers are its own files' to include (the allocator's internals, graph/graph_internal.h).
    bad = {inc for inc in local_includes(rel) if inc not in PUBLIC and
           not (os.path.dirname(inc) and os.path.dirname(inc) == os.path.dirname(rel))}
    assert not bad, f"device_core/{rel} includes runtime/allocator internals {sorted(bad)}; use {C_ABI} " \
                    "(through npu_runtime.h) or allocator/npu_allocator.h"
    text = _read(rel)
    assert "npudist::runtime" not in text and "runtime::" not in text, \
        f"device_core/{rel} calls the emulated runtime's C++ internals; call the C table (rt::api())"


@pytest.mark.parametrize("rel", RUNTIME)
def test_runtime_does_not_depend_on_allocator_or_torch(rel):
    incs = transitive_includes(rel)
    assert not any(i.startswith("allocator/") for i in incs), f"device_core/{rel} includes the allocator: {incs}"
    assert not re.search(r"#\s*include\s*<(ATen|c10|torch)/", _read(rel)), f"device_core/{rel} includes torch"


def test_c_abi_header_is_plain_c():
    text = _read(os.path.join("include", C_ABI))
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)
    assert not re.search(r"#\s*include\s*<(?!stdint\.h>)", code), "the C ABI header may include only <stdint.h>"
    for cxx in ("namespace", "class ", "template", "std::", "&)", "bool "):
        assert cxx not in code, f"C++ construct {cxx!r} in the C ABI header"


def test_host_memory_markers_only_in_runtime_and_fallback():
    marked = set()
    for dirpath, _, names in os.walk(CORE):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), CORE)
            if "HOST-MEMORY:" in _read(rel):
                marked.add(rel)
    assert marked == HOST_MEMORY_FILES, f"HOST-MEMORY markers in {sorted(marked)}, expected exactly " \
                                        f"{sorted(HOST_MEMORY_FILES)} (docs/backends.md lists each)"


def _host_memory_section() -> str:
    with open(os.path.join(ROOT, "docs", "backends.md")) as f:
        return f.read().split("### Where the emulation assumes device memory is host memory", 1)[-1]


def check_doc_lists_markers(sources: dict[str, str]) -> None:
    """docs/backends.md has one table row per HOST-MEMORY marker of each source (repo path -> text)."""
    section = _host_memory_section()
    for path, text in sources.items():
        markers, rows = text.count("HOST-MEMORY:"), section.count(f"| `{path}` |")
        assert rows == markers, f"{path} has {markers} HOST-MEMORY markers but docs/backends.md lists {rows} " \
                                "places in it (one table row per marker)"


def test_backends_doc_lists_every_host_memory_marker():
    check_doc_lists_markers({f"device_core/{rel}": _read(rel) for rel in HOST_MEMORY_FILES})


# --- the rooms stack: no circle ---------------------------------------------------------------------------------
# npu_tensor.h declares functions that several files define; each declaration names its file in a comment above it.
SHARED_HEADER = "npu_tensor.h"
_DECLARED = re.compile(r"^(?!inline\b|constexpr\b|using\b|namespace\b|#)[\w:<>&*, ]+?\b(\w+)\([^;{]*\)\s*;", re.M)


def _definers(name: str, member_of: str = "") -> list[str]:
    """The device_core .cpp files that define `name`: a column-0 line naming it that opens a body or continues
    (a call or a declaration ends in `;`), or `Class::` members."""
    def defines(line: str) -> bool:
        if member_of:
            return line.startswith(f"{name}::")
        return bool(re.match(rf"[^\s/#].*\b{name}\(", line)) and ("{" in line or not line.rstrip().endswith(";"))
    return [rel for rel in GLUE + RUNTIME + ALLOCATOR
            if rel.endswith(".cpp") and any(defines(line) for line in _code(_read(rel)).splitlines())]


def shared_declarations() -> dict[str, str]:
    """Each function npu_tensor.h declares, and each class of it with members defined elsewhere -> the defining file."""
    code = _code(_read(SHARED_HEADER))
    out = {}
    for name in _DECLARED.findall(code):
        files = _definers(name)
        assert len(files) == 1, f"{SHARED_HEADER} declares {name}, defined in {files or 'no file'}: want exactly one"
        out[name] = files[0]
    for name in re.findall(r"^class (\w+)", code, re.M):
        files = _definers(name, member_of=name)
        assert len(files) <= 1, f"{SHARED_HEADER}'s class {name} has members defined in several files: {files}"
        if files:
            out[name] = files[0]
    return out


def test_shared_header_names_the_file_of_each_declaration():
    """The file a declaration's comment names (the first .cpp named in the nearest comment line that names one)
    is the file that defines it."""
    declared, named = shared_declarations(), None
    for line in _read(SHARED_HEADER).splitlines():
        if line.lstrip().startswith("//"):
            files = re.findall(r"[\w/]+\.cpp", line)
            named = files[0] if files else named
            continue
        m = _DECLARED.match(line) or re.match(r"class (\w+)", line)
        if m and m.group(1) in declared:
            assert named == declared[m.group(1)], f"{SHARED_HEADER}: {m.group(1)} is defined in " \
                f"{declared[m.group(1)]}, but the comment above it names {named}"
    assert {"cpu_alias", "AdoptScope", "adopt_storage", "resize_npu_storage"} <= declared.keys(), declared


def _node(rel: str) -> str:
    """A room, or a top-level file: those are not one room (module.cpp binds every room, npu_tensor.cpp is below
    every room), so each is a node of its own."""
    return os.path.dirname(rel) or rel


def room_graph() -> dict[str, dict[str, str]]:
    """node -> node it depends on -> why: an include of a file of the other node, or a use of a function that
    npu_tensor.h declares and a file of the other node defines (the link-level edge the include hides)."""
    declared, edges = shared_declarations(), {}
    for rel in GLUE + RUNTIME + ALLOCATOR:
        here = edges.setdefault(_node(rel), {})
        for inc in local_includes(rel):
            if inc != C_ABI and not inc.startswith("include" + os.sep) and _node(inc) != _node(rel):
                here.setdefault(_node(inc), f"{rel} includes {inc}")
        if rel == SHARED_HEADER:
            continue  # declaring is not using
        code = _code(_read(rel))
        for name, definer in declared.items():
            if _node(definer) != _node(rel) and re.search(rf"\b{name}\b", code):
                here.setdefault(_node(definer), f"{rel} uses {name} ({definer})")
    return edges


def find_circle(edges: dict[str, dict[str, str]]) -> list[str]:
    """One circle of the graph as its edges' reasons, or [] if there is none."""
    state, path = {}, []

    def visit(a: str) -> list[str]:
        state[a] = "open"
        path.append(a)
        for b in sorted(edges.get(a, {})):
            if state.get(b) == "open":
                ring = path[path.index(b):] + [b]
                return [edges[x][y] for x, y in zip(ring, ring[1:])]
            if b not in state and (found := visit(b)):
                return found
        path.pop()
        state[a] = "done"
        return []

    for a in sorted(edges):
        if a not in state and (found := visit(a)):
            return found
    return []


def test_circle_finder_sees_two_rooms_including_each_other():
    mutual = {"graph": {"op_path": "graph/x.cpp includes op_path/y.h"},
              "op_path": {"graph": "op_path/y.cpp includes graph/x.h"}, "aten": {"graph": "aten/z.cpp includes graph/x.h"}}
    assert find_circle(mutual) == ["graph/x.cpp includes op_path/y.h", "op_path/y.cpp includes graph/x.h"]
    assert find_circle({"graph": {"op_path": "g"}, "op_path": {"launch": "o"}, "launch": {}}) == []


def test_rooms_have_no_circle():
    graph = room_graph()
    assert "op_path" in graph["graph"] or "launch" in graph["graph"], graph["graph"]  # the graph sees edges at all
    circle = find_circle(graph)
    assert not circle, "device_core rooms depend on each other in a circle: " + "; ".join(circle) + \
        ". Move what both sides need below them (as npu_tensor.cpp holds the CPU-alias primitives)"


# --- the communicator seam (npudist/hccl) ---------------------------------------------------------------

HCCL = os.path.join(ROOT, "npudist", "hccl")
COMM_INTERFACE = os.path.join("csrc", "include", "npudist", "communicator.h")
# The collective vocabulary both the seam and the engine speak (element types, reductions, failures).
COMM_TYPES = os.path.join("csrc", "include", "npudist", "comm_types.h")
ENGINE_API = os.path.join("engine", "engine.h")
# The engine adapted to the seam, and the factory that connects it: the only csrc files that see the engine.
ENGINE_USERS = {os.path.join("csrc", n) for n in ("shm_communicator.h", "communicator_factory.cpp")}
# The communicators that read or write npu memory with the CPU (each place marked).
HCCL_HOST_MEMORY_FILES = {os.path.join("csrc", n) for n in ("shm_communicator.cpp", "gloo_communicator.cpp",
                                                             "hierarchical_communicator.cpp")}


def _hccl_read(rel: str) -> str:
    with open(os.path.join(HCCL, rel)) as f:
        return f.read()


def _hccl_sources() -> list[str]:
    out = []
    for dirpath, _, names in os.walk(HCCL):
        out += [os.path.relpath(os.path.join(dirpath, n), HCCL) for n in names if n.endswith((".cpp", ".h"))]
    return sorted(out)


def _code(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


def declared_types(rel: str) -> set[str]:
    """Every type a header declares (enums, structs, classes, aliases)."""
    code = _code(_hccl_read(rel))
    return set(re.findall(r"\b(?:enum\s+class|struct|class)\s+(\w+)", code)) | \
        set(re.findall(r"\busing\s+(\w+)\s*=", code))


def _includes(rel: str) -> list[str]:
    return re.findall(r'#\s*include\s*([<"][^>"]+[>"])', _code(_hccl_read(rel)))


def test_type_detector_sees_both_vocabularies():
    assert {"ShmEngine", "CommConfig", "Bootstrap"} <= declared_types(ENGINE_API)
    assert {"ElementType", "Reduction", "FailureKind", "CommError", "CollectiveInfo"} <= declared_types(COMM_TYPES)


def test_communicator_interface_names_no_engine_type():
    code = _code(_hccl_read(COMM_INTERFACE))
    found = sorted(n for n in declared_types(ENGINE_API) if re.search(rf"\b{n}\b", code))
    assert not found, f"npudist/hccl/{COMM_INTERFACE} names engine types {found}; use the seam's own"
    includes = _includes(COMM_INTERFACE)
    assert all((i.startswith("<") and "/" not in i) or i == '"npudist/comm_types.h"' for i in includes), \
        f"the communicator interface may include only standard headers and the vocabulary, got {includes}"


def test_one_collective_vocabulary_below_seam_and_engine():
    """The engine implements the seam's types: it declares no element type, reduction or error of its own."""
    assert all(i.startswith("<") and "/" not in i for i in _includes(COMM_TYPES)), _includes(COMM_TYPES)
    assert '"npudist/comm_types.h"' in _includes(ENGINE_API)
    engine_types = set()
    for rel in _hccl_sources():
        if rel.startswith("engine"):
            engine_types |= declared_types(rel)
    vocabulary = declared_types(COMM_TYPES)
    twins = {"DataType", "ReduceOp", "ErrorKind", "EngineError", "OpInfo"}   # what a second vocabulary is called
    assert not engine_types & (vocabulary | twins), sorted(engine_types & (vocabulary | twins))


def test_only_the_shm_adapter_and_the_factory_include_the_engine():
    users = {rel for rel in _hccl_sources() if rel.startswith("csrc")
             and re.search(r'#\s*include\s*"engine\.h"', _hccl_read(rel))}
    assert users == ENGINE_USERS, f"csrc files including engine.h: {sorted(users)}, expected {sorted(ENGINE_USERS)}"


def test_hccl_host_memory_markers_only_in_the_communicators():
    marked = {rel for rel in _hccl_sources() if "HOST-MEMORY:" in _hccl_read(rel)}
    assert marked == HCCL_HOST_MEMORY_FILES, f"HOST-MEMORY markers in npudist/hccl {sorted(marked)}, expected " \
                                             f"{sorted(HCCL_HOST_MEMORY_FILES)}"
    # Every CPU view or copy of caller memory in them sits under a marker (within the 3 lines above it).
    for rel in HCCL_HOST_MEMORY_FILES - {os.path.join("csrc", "shm_communicator.cpp")}:
        lines = _hccl_read(rel).splitlines()
        for i, line in enumerate(lines):
            if re.search(r"\b(from_blob|std::memcpy)\(", line):
                window = "\n".join(lines[max(0, i - 4):i])
                assert "HOST-MEMORY:" in window, f"npudist/hccl/{rel}:{i + 1} touches caller memory unmarked"
    check_doc_lists_markers({f"npudist/hccl/{rel}": _hccl_read(rel) for rel in HCCL_HOST_MEMORY_FILES})


def test_c_tables_reach_hccl_as_named_capsules():
    import torch  # noqa: F401  (registers npudist)
    import npudist._C as device_ext
    import npudist.hccl._C as hccl_ext
    for getter, setter, name in (("_runtime_api", "_set_runtime_api", "npudist.runtime_api"),
                                 ("_launch_api", "_set_launch_api", "npudist.launch_api"),
                                 ("_profiler_api", "_set_profiler_api", "npudist.profiler_api")):
        table = getattr(device_ext, getter)()
        assert type(table).__name__ == "PyCapsule" and name in repr(table), (getter, table)
        with pytest.raises(TypeError, match=name):
            getattr(hccl_ext, setter)(12345)
        getattr(hccl_ext, setter)(table)   # what npudist.hccl does at import: idempotent
