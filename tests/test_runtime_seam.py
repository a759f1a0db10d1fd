"""The device-runtime seam (docs/backends.md): the aten glue and the caching allocator reach the runtime only
through its C ABI header, the runtime does not depend on the allocator, and host-memory assumptions are
marked with `HOST-MEMORY:` only in the emulated runtime and the fallback. Reads sources; builds nothing."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "device_core")
C_ABI = "npudist/runtime_c_api.h"
GLUE = ["kernels.cpp", "fallback.cpp", "guard.cpp", "hooks.cpp", "batch_norm.cpp", "module.cpp", "autocast.cpp",
        "npu_tensor.h", "npu_runtime.h", "profiler.h", "profiler_record.cpp", "profiler_kineto.cpp",
        "graph_capture.h", "graph_capture.cpp", "launch.h", "launch.cpp"]
RUNTIME = ["runtime.cpp", "runtime_memory.cpp", "runtime_c_api.cpp", "runtime_usage.cpp", "runtime_internal.h"]
ALLOCATOR = sorted(os.path.join("allocator", n) for n in os.listdir(os.path.join(CORE, "allocator")))
# Headers that other parts of device_core may include: the C ABI, the glue's helpers, the allocator's
# torch-facing interface.
PUBLIC = {C_ABI, "npu_runtime.h", "npu_tensor.h", "allocator/npu_allocator.h", "profiler.h", "graph_capture.h", "launch.h",
          "include/npudist/profiler_c_api.h", "include/npudist/launch_c_api.h"}
# Allowed to say HOST-MEMORY (everything else reaches memory through the runtime table).
HOST_MEMORY_FILES = {"runtime_memory.cpp", "runtime_c_api.cpp", "fallback.cpp"}

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


def test_every_device_core_source_is_classified():
    listed = set(GLUE) | set(RUNTIME) | set(ALLOCATOR)
    present = {n for n in os.listdir(CORE) if n.endswith((".cpp", ".h"))} | set(ALLOCATOR)
    assert present == listed, "new device_core file: add it to GLUE, RUNTIME or the allocator in this test"


@pytest.mark.parametrize("rel", GLUE + ALLOCATOR)
def test_glue_and_allocator_use_only_the_c_abi(rel):
    bad = {inc for inc in local_includes(rel) if inc not in PUBLIC and not
           (rel.startswith("allocator/") and inc.startswith("allocator/"))}
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


def test_backends_doc_lists_every_host_memory_marker():
    with open(os.path.join(ROOT, "docs", "backends.md")) as f:
        doc = f.read()
    section = doc.split("### Where the emulation assumes device memory is host memory", 1)[-1]
    for rel in HOST_MEMORY_FILES:
        markers = _read(rel).count("HOST-MEMORY:")
        rows = section.count(f"| `device_core/{rel}` |")
        assert rows == markers, f"device_core/{rel} has {markers} HOST-MEMORY markers but docs/backends.md " \
                                f"lists {rows} places in it (one table row per marker)"
