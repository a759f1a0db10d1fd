"""Builds tests/allocator/core_test_*.cpp against the torch-free allocator core with g++ and runs each of
its tests (split/merge, rounding, per-stream reuse, record_stream, OOM, expandable segments, ...)."""
import glob
import hashlib
import os
import re
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ALLOC = os.path.join(ROOT, "device_core", "allocator")
CORE_SOURCES = ["alloc_config.cpp", "expandable_region.cpp", "caching_allocator.cpp", "device_allocator.cpp",
                "device_expandable.cpp", "device_info.cpp", "device_private_pools.cpp"]
TEST_SRCS = sorted(glob.glob(os.path.join(HERE, "core_test_*.cpp")))


def _test_names():
    names = []
    for path in TEST_SRCS:
        with open(path) as f:
            names += re.findall(r'\{"(\w+)", test_\w+\}', f.read())
    return names


@pytest.fixture(scope="module")
def core_test_binary():
    if shutil.which("g++") is None:
        pytest.skip("g++ not available")
    flags = ["-std=c++17", "-O1", "-g", "-Wall", "-Werror", "-pthread"]
    if os.environ.get("NPUDIST_TEST_SANITIZE") == "1":
        flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    sources = TEST_SRCS + [os.path.join(ALLOC, s) for s in CORE_SOURCES]
    # Cached by content under build/ so xdist workers and reruns share one build.
    h = hashlib.sha1(" ".join(flags).encode())
    headers = [os.path.join(ALLOC, n) for n in os.listdir(ALLOC) if n.endswith(".h")]
    for path in sources + headers + glob.glob(os.path.join(HERE, "*.h")):
        with open(path, "rb") as f:
            h.update(f.read())
    cache = os.path.join(ROOT, "build", "alloc_core_test")
    os.makedirs(cache, exist_ok=True)
    out = os.path.join(cache, "core_test-" + h.hexdigest()[:16])
    if not os.path.exists(out):
        tmp = f"{out}.{os.getpid()}.tmp"
        cmd = ["g++", *flags, "-I" + ALLOC, "-I" + HERE, *sources, "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert res.returncode == 0, res.stderr[-4000:]
        os.replace(tmp, out)
    return out


def test_every_core_test_is_collected(core_test_binary):
    listed = subprocess.run([core_test_binary, "--list"], capture_output=True, text=True, timeout=30)
    assert sorted(listed.stdout.split()) == sorted(_test_names())


@pytest.mark.parametrize("name", _test_names())
def test_core(core_test_binary, name):
    res = subprocess.run([core_test_binary, name], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and f"PASS {name}" in res.stdout, res.stdout + res.stderr
