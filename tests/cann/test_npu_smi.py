"""npu-smi: devices and their processes, from the usage records the processes publish (npudist/cann/smi.py)."""
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npudist.cann import smi

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
from launch_helpers import collect_lines, finish, start_npurun  # noqa: E402

NPU_SMI = os.path.join(os.path.dirname(sys.executable), "npu-smi")
SCRIPT = Path(__file__).parent / "scripts" / "hold_memory.py"


def _npu_smi(*args, env=None):
    return subprocess.run([NPU_SMI, *args], capture_output=True, text=True, timeout=60, env=env)


def _device_rows(text: str) -> dict[int, tuple[int, int]]:
    """{device: (HBM used MB, total MB)} from the device table."""
    rows, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\| (\d+)\s+NpudistEmulatedNPU\s+\| OK", line)
        if m:
            current = int(m.group(1))
            continue
        m = re.search(r"(\d+) / (\d+)\s+\|$", line)
        if m and current is not None:
            rows[current] = (int(m.group(1)), int(m.group(2)))
            current = None
    return rows


def _process_rows(text: str) -> dict[int, list[tuple[int, int]]]:
    """{device: [(pid, MB), ...]} from the process table."""
    found: dict[int, list[tuple[int, int]]] = {}
    for m in re.finditer(r"^\| (\d+)\s+0\s+\| (\d+)\s+\| \S+\s+\| (\d+)", text, re.M):
        found.setdefault(int(m.group(1)), []).append((int(m.group(2)), int(m.group(3))))
    return found


@pytest.mark.timeout(300)
def test_npu_smi_info_shows_a_4_rank_job(tmp_path):
    release = tmp_path / "release"
    proc = start_npurun(["--nproc", "4", str(SCRIPT), str(release)], tmp_path)
    lines, pump = collect_lines(proc.stdout)
    # stderr is drained as it comes too: four ranks' start-up warnings could fill an unread pipe and block a
    # rank before it says READY.
    errors, err_pump = collect_lines(proc.stderr)
    try:
        deadline = time.monotonic() + 240
        while sum("READY" in ln for ln in lines) < 4 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        ready = [ln for ln in lines if "READY" in ln]
        assert len(ready) == 4, (f"exit code {proc.poll()}\nstdout:\n" + "".join(lines) + "\nstderr:\n"
                                 + "".join(errors)[-4000:])
        pids = {int(ln.split("READY ")[1].split()[0]) for ln in ready}
        res = _npu_smi("info")
    finally:
        release.touch()
        pump.join(timeout=60)
        err_pump.join(timeout=60)
        result = finish(proc, stdout_lines=lines, stderr_lines=errors)
    assert res.returncode == 0, res.stderr
    devices, procs = _device_rows(res.stdout), _process_rows(res.stdout)
    assert sorted(devices) == list(range(8)), res.stdout
    for d in range(4):
        used, total = devices[d]
        assert 64 <= used <= total == 16384, res.stdout
        assert any(pid in pids and mb >= 64 for pid, mb in procs.get(d, [])), res.stdout
    assert {pid for d in range(4) for pid, _ in procs.get(d, [])} >= pids, res.stdout
    assert result.returncode == 0, result.output[-4000:]
    # The workers exited: their records are gone with them.
    assert not any(os.path.exists(f"/dev/shm/{smi.PREFIX}{pid}") for pid in pids)


def test_npu_smi_list_and_configuration_errors():
    res = _npu_smi("info", "-l", env=dict(os.environ, NPUDIST_DEVICE_COUNT="3"))
    assert res.returncode == 0 and "Total Count                    : 3" in res.stdout, res.stdout
    assert res.stdout.count("NPU ID") == 3
    res = _npu_smi("info", env=dict(os.environ, NPUDIST_DEVICE_MEMORY="lots"))
    assert res.returncode == 2 and "NPUDIST_DEVICE_MEMORY='lots' is not a positive size" in res.stderr, res.stderr


def test_stale_records_are_removed_and_live_ones_read(tmp_path):
    def record(pid, used, capacity):
        return struct.pack(f"=8sIi{smi.MAX_DEVICES}Q{smi.MAX_DEVICES}Q", smi.MAGIC, 1, pid,
                           *(used + [0] * (smi.MAX_DEVICES - len(used))),
                           *(capacity + [0] * (smi.MAX_DEVICES - len(capacity))))

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{smi.PREFIX}{dead.pid}"
    stale.write_bytes(record(dead.pid, [1 << 20], [1 << 30]))
    assert smi.read_processes(str(tmp_path)) == []
    assert not stale.exists()
    # A live process is listed only while it has its record mapped (a reused pid has not).
    live = tmp_path / f"{smi.PREFIX}{os.getpid()}"
    live.write_bytes(record(os.getpid(), [0, 3 << 20], [0, 1 << 30]))
    import mmap
    with open(live, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ):
        (p,) = smi.read_processes(str(tmp_path))
    assert (p.pid, p.used, p.capacity) == (os.getpid(), {1: 3 << 20}, {1: 1 << 30})
