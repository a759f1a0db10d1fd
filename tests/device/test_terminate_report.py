"""A C++ std::terminate anywhere in the process names its thread and prints a native backtrace before the abort
(device_core/runtime/terminate_report.cpp), then libstdc++'s own handler still runs."""
import subprocess
import sys

import pytest

CODE = """
import ctypes, threading
import torch, npudist._C  # the device core (after torch), which installs the handler when it is loaded
def boom():
    libc = ctypes.CDLL(None)
    libc.prctl(15, b"boom_thread", 0, 0, 0)  # PR_SET_NAME: the pthread name the report prints
    ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev()
t = threading.Thread(target=boom)
t.start()
t.join()
"""


@pytest.mark.timeout(120)
def test_terminate_names_the_thread_and_prints_a_backtrace():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=100)
    assert r.returncode == -6, (r.returncode, r.stderr[-3000:])
    assert "npudist: std::terminate on thread 'boom_thread' (no exception being handled)" in r.stderr, r.stderr[-3000:]
    assert "native backtrace:" in r.stderr and "libstdc++" in r.stderr, r.stderr[-3000:]
    # The handler that was installed before still runs: the process ends the way it did without npudist.
    assert "terminate called without an active exception" in r.stderr, r.stderr[-3000:]
