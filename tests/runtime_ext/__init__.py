"""Test-only bindings over the device runtime's C ABI (runtime_test_ext.c).

Why a test-built plain-C extension rather than ``npudist._C_test`` from setup.py: it needs only Python.h and
the C header (no torch headers), so the C compiler builds it in about a second when a test first needs it,
cached by content under build/ like the allocator core tests; nothing test-only ships in the package; and it
reaches the runtime exactly as an out-of-tree extension would, through the ``npudist._C._runtime_api()``
capsule.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sysconfig

import torch

import npudist  # noqa: F401  (registers the npu device)
from npudist import _C

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SOURCE = os.path.join(HERE, "runtime_test_ext.c")
HEADER = os.path.join(REPO, "device_core", "include", "npudist", "runtime_c_api.h")
MODULE = "_npudist_runtime_test"

# Copy kinds (NpudistMemcpyKind)
HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = 0, 1, 2, 3
# Status codes (npudist_status)
SUCCESS, INVALID_VALUE, INVALID_DEVICE, OUT_OF_MEMORY, NOT_READY = 0, 1, 2, 3, 4

_ext = None


def _build() -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("tests/runtime_ext: no C compiler (cc/gcc) found")
    flags = ["-std=c11", "-O1", "-g", "-Wall", "-Werror", "-shared", "-fPIC"]
    h = hashlib.sha1(" ".join(flags).encode())
    for path in (SOURCE, HEADER):
        with open(path, "rb") as f:
            h.update(f.read())
    cache = os.path.join(REPO, "build", "runtime_test_ext")
    os.makedirs(cache, exist_ok=True)
    out = os.path.join(cache, f"{MODULE}-{h.hexdigest()[:16]}{sysconfig.get_config_var('EXT_SUFFIX')}")
    if not os.path.exists(out):
        tmp = f"{out}.{os.getpid()}.tmp"
        cmd = [cc, *flags, "-I" + sysconfig.get_paths()["include"], "-I" + os.path.dirname(os.path.dirname(HEADER)),
               SOURCE, "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError("building tests/runtime_ext failed:\n" + res.stderr[-4000:])
        os.replace(tmp, out)  # atomic: concurrent builders (xdist workers, ranks) agree on one file
    return out


def ext():
    """The compiled test extension (built on first use)."""
    global _ext
    if _ext is None:
        spec = importlib.util.spec_from_file_location(MODULE, _build())
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _ext = mod
    return _ext


def api():
    """The runtime table capsule, as npudist.hccl receives it."""
    return _C._runtime_api()


def launch_host_fill(target: torch.Tensor, value: float, delay_us: int, stream_id: int) -> None:
    """Enqueue on stream ``stream_id`` of target's device a host function that sleeps ``delay_us``, then
    fills ``target`` with ``value`` (asynchronous "device work", as a collective would be)."""
    if target.device.type != "npu" or not target.is_contiguous():
        raise ValueError("launch_host_fill: expected a contiguous npu tensor")
    dev = target.device.index
    # The block must outlive the host function even if the caller drops the tensor.
    device_type = torch.npu.default_stream(dev).device_type
    target.record_stream(torch.npu.Stream(stream_id=stream_id, device_index=dev, device_type=device_type))
    pattern = bytes(torch.tensor([value], dtype=target.dtype).view(torch.uint8).tolist())
    status, err = ext().launch_host_fill(api(), target.data_ptr(), target.numel() * target.element_size(), pattern,
                                         delay_us, dev, stream_id)
    if status != SUCCESS:
        raise RuntimeError(f"launch_host_func failed ({status}): {err}")


class HostGate:
    """A host function holding an npu stream closed until ``open()`` (at most 60 s): work queued behind it
    waits, which makes asynchronous launch observable without timing."""

    def __init__(self, device: int, stream_id: int):
        status, self._handle = ext().launch_host_gate(api(), device, stream_id)
        if status != SUCCESS:
            raise RuntimeError(f"launch_host_func failed ({status})")

    def open(self) -> None:
        handle, self._handle = self._handle, 0  # once, even when a timer thread and the test both open it
        if handle:
            ext().open_host_gate(handle)

    def __enter__(self) -> "HostGate":
        return self

    def __exit__(self, *exc) -> None:
        self.open()
